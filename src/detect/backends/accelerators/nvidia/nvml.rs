//! NVML (`libnvidia-ml.so.1`), loaded at run time so the binary runs on machines without the
//! NVIDIA driver.
//!
//! Signatures, struct layouts and constants follow `nvml.h`. Only five entry points are
//! required (init, shutdown, device count, handle by index, PCI info); every other one is
//! optional, so an older driver that lacks, say, row remapping still gives the rest.
//!
//! Safety rests on two invariants of this module: every function pointer in [`Api`] was
//! looked up with the exact type `nvml.h` declares for its symbol, and it is only called while
//! the [`Library`] it came from is loaded ([`Nvml`] owns both and drops the library last).
//! Device handles are only used between a successful `nvmlInit_v2` and its `nvmlShutdown`.

use std::ffi::{CStr, OsStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::path::Path;

use libloading::Library;

use super::nvlink::GpuLinks;
use super::{GpuRecord, HealthFacts, Inventory};
use crate::detect::pci::canonical_bus_id;
use crate::hardware::Partition;

/// The library's file name; the dynamic loader finds it on the host's library path.
const LIBRARY: &str = "libnvidia-ml.so.1";

type Return = c_int;
type Handle = *mut c_void;

const SUCCESS: Return = 0;
const ERROR_INSUFFICIENT_SIZE: Return = 7;

/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`, also enough for UUIDs (`NVML_DEVICE_UUID_V2_BUFFER_SIZE`).
const NAME_BUFFER: usize = 96;
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
const DRIVER_VERSION_BUFFER: usize = 80;
/// `NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE`.
const VBIOS_BUFFER: usize = 32;
/// `NVML_NVLINK_MAX_LINKS` in current headers.
const NVLINK_MAX_LINKS: c_uint = 36;
/// Retired page addresses asked for at once; NVML reports the full count when there are more.
const RETIRED_PAGES_BUFFER: usize = 256;
/// More GPUs than any machine has: a bound on a count we did not check ourselves.
const MAX_DEVICES: c_uint = 256;

/// `NVML_FEATURE_ENABLED`.
const FEATURE_ENABLED: c_int = 1;
/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: c_uint = 1;
/// `NVML_MEMORY_ERROR_TYPE_CORRECTED` and `_UNCORRECTED`.
const ERROR_CORRECTED: c_int = 0;
const ERROR_UNCORRECTED: c_int = 1;
/// `NVML_VOLATILE_ECC`: counts since the driver loaded.
const VOLATILE_ECC: c_int = 0;
/// `NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS` and `_DOUBLE_BIT_ECC_ERROR`.
const RETIREMENT_CAUSES: [c_int; 2] = [0, 1];
/// `NVML_NVLINK_DEVICE_TYPE_GPU` and `_SWITCH`.
const LINK_TO_GPU: c_int = 0;
const LINK_TO_SWITCH: c_int = 2;

/// `nvmlPciInfo_t`.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

impl PciInfo {
    fn zeroed() -> Self {
        Self {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        }
    }

    fn canonical_bus_id(&self) -> Option<String> {
        canonical_bus_id(&c_string(&self.bus_id)?)
            .or_else(|| canonical_bus_id(&c_string(&self.bus_id_legacy)?))
    }
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type InitFn = unsafe extern "C" fn() -> Return;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Return;
type HandleByIndexFn = unsafe extern "C" fn(c_uint, *mut Handle) -> Return;
type PciInfoFn = unsafe extern "C" fn(Handle, *mut PciInfo) -> Return;
type SystemStringFn = unsafe extern "C" fn(*mut c_char, c_uint) -> Return;
type DeviceStringFn = unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> Return;
type MemoryFn = unsafe extern "C" fn(Handle, *mut Memory) -> Return;
/// Two `int`-sized outputs: compute capability, or current/pending ECC mode (an enum).
type IntPairFn = unsafe extern "C" fn(Handle, *mut c_int, *mut c_int) -> Return;
/// Two `unsigned int` outputs: current/pending MIG mode.
type UintPairFn = unsafe extern "C" fn(Handle, *mut c_uint, *mut c_uint) -> Return;
type UintFn = unsafe extern "C" fn(Handle, *mut c_uint) -> Return;
/// One enum output: retired pages pending.
type EnumFn = unsafe extern "C" fn(Handle, *mut c_int) -> Return;
type ChildHandleFn = unsafe extern "C" fn(Handle, c_uint, *mut Handle) -> Return;
type EccCountFn = unsafe extern "C" fn(Handle, c_int, c_int, *mut c_ulonglong) -> Return;
type RetiredPagesFn = unsafe extern "C" fn(Handle, c_int, *mut c_uint, *mut c_ulonglong) -> Return;
type RemappedRowsFn =
    unsafe extern "C" fn(Handle, *mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint) -> Return;
/// Per-link enum output: NVLink state, remote device type.
type LinkEnumFn = unsafe extern "C" fn(Handle, c_uint, *mut c_int) -> Return;
type LinkPciFn = unsafe extern "C" fn(Handle, c_uint, *mut PciInfo) -> Return;

/// The entry points used, by `nvml.h` name.
struct Api {
    init: InitFn,                           // nvmlInit_v2
    shutdown: InitFn,                       // nvmlShutdown
    device_count: CountFn,                  // nvmlDeviceGetCount_v2
    handle_by_index: HandleByIndexFn,       // nvmlDeviceGetHandleByIndex_v2
    pci_info: PciInfoFn,                    // nvmlDeviceGetPciInfo_v3
    driver_version: Option<SystemStringFn>, // nvmlSystemGetDriverVersion
    name: Option<DeviceStringFn>,           // nvmlDeviceGetName
    uuid: Option<DeviceStringFn>,           // nvmlDeviceGetUUID
    vbios: Option<DeviceStringFn>,          // nvmlDeviceGetVbiosVersion
    memory: Option<MemoryFn>,               // nvmlDeviceGetMemoryInfo
    compute_capability: Option<IntPairFn>,  // nvmlDeviceGetCudaComputeCapability
    mig_mode: Option<UintPairFn>,           // nvmlDeviceGetMigMode
    max_mig_devices: Option<UintFn>,        // nvmlDeviceGetMaxMigDeviceCount
    mig_handle: Option<ChildHandleFn>,      // nvmlDeviceGetMigDeviceHandleByIndex
    gpu_instance_id: Option<UintFn>,        // nvmlDeviceGetGpuInstanceId
    ecc_mode: Option<IntPairFn>,            // nvmlDeviceGetEccMode
    ecc_errors: Option<EccCountFn>,         // nvmlDeviceGetTotalEccErrors
    retired_pages: Option<RetiredPagesFn>,  // nvmlDeviceGetRetiredPages
    retirement_pending: Option<EnumFn>,     // nvmlDeviceGetRetiredPagesPendingStatus
    remapped_rows: Option<RemappedRowsFn>,  // nvmlDeviceGetRemappedRows
    nvlink_state: Option<LinkEnumFn>,       // nvmlDeviceGetNvLinkState
    nvlink_remote_type: Option<LinkEnumFn>, // nvmlDeviceGetNvLinkRemoteDeviceType
    nvlink_remote_pci: Option<LinkPciFn>,   // nvmlDeviceGetNvLinkRemotePciInfo_v2
}

/// A loaded NVML library.
pub(super) struct Nvml {
    api: Api,
    // Declared last so it is dropped last: `api` points into it.
    _library: Library,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1` through the dynamic loader's normal search.
    pub(super) fn load() -> Result<Self, String> {
        Self::open(OsStr::new(LIBRARY))
    }

    /// Loads NVML from an explicit path (tests load a fake library this way).
    #[cfg(test)]
    pub(super) fn load_from(path: &Path) -> Result<Self, String> {
        Self::open(path.as_os_str())
    }

    fn open(file: &OsStr) -> Result<Self, String> {
        let library = open_library(file)?;
        let required = |name: &str| format!("{} has no {name}", Path::new(file).display());
        let api = Api {
            init: symbol(&library, "nvmlInit_v2").ok_or_else(|| required("nvmlInit_v2"))?,
            shutdown: symbol(&library, "nvmlShutdown").ok_or_else(|| required("nvmlShutdown"))?,
            device_count: symbol(&library, "nvmlDeviceGetCount_v2")
                .ok_or_else(|| required("nvmlDeviceGetCount_v2"))?,
            handle_by_index: symbol(&library, "nvmlDeviceGetHandleByIndex_v2")
                .ok_or_else(|| required("nvmlDeviceGetHandleByIndex_v2"))?,
            pci_info: symbol(&library, "nvmlDeviceGetPciInfo_v3")
                .ok_or_else(|| required("nvmlDeviceGetPciInfo_v3"))?,
            driver_version: symbol(&library, "nvmlSystemGetDriverVersion"),
            name: symbol(&library, "nvmlDeviceGetName"),
            uuid: symbol(&library, "nvmlDeviceGetUUID"),
            vbios: symbol(&library, "nvmlDeviceGetVbiosVersion"),
            memory: symbol(&library, "nvmlDeviceGetMemoryInfo"),
            compute_capability: symbol(&library, "nvmlDeviceGetCudaComputeCapability"),
            mig_mode: symbol(&library, "nvmlDeviceGetMigMode"),
            max_mig_devices: symbol(&library, "nvmlDeviceGetMaxMigDeviceCount"),
            mig_handle: symbol(&library, "nvmlDeviceGetMigDeviceHandleByIndex"),
            gpu_instance_id: symbol(&library, "nvmlDeviceGetGpuInstanceId"),
            ecc_mode: symbol(&library, "nvmlDeviceGetEccMode"),
            ecc_errors: symbol(&library, "nvmlDeviceGetTotalEccErrors"),
            retired_pages: symbol(&library, "nvmlDeviceGetRetiredPages"),
            retirement_pending: symbol(&library, "nvmlDeviceGetRetiredPagesPendingStatus"),
            remapped_rows: symbol(&library, "nvmlDeviceGetRemappedRows"),
            nvlink_state: symbol(&library, "nvmlDeviceGetNvLinkState"),
            nvlink_remote_type: symbol(&library, "nvmlDeviceGetNvLinkRemoteDeviceType"),
            nvlink_remote_pci: symbol(&library, "nvmlDeviceGetNvLinkRemotePciInfo_v2"),
        };
        Ok(Self {
            api,
            _library: library,
        })
    }

    /// Describes every GPU. Fails when NVML cannot start (no driver, version mismatch) or
    /// cannot count the GPUs; a GPU it cannot get a handle or bus id for is left to sysfs.
    pub(super) fn inventory(&self) -> Result<Inventory, String> {
        let session = Session::start(self)?;
        let count = session
            .nvml
            .count(self.api.device_count)
            .ok_or("nvmlDeviceGetCount_v2 failed")?;
        let driver_version = self
            .api
            .driver_version
            .and_then(|f| self.system_string(f, DRIVER_VERSION_BUFFER));
        let mut inventory = Inventory::default();
        for index in 0..count.min(MAX_DEVICES) {
            let Some(handle) = self.handle_by_index(index) else {
                continue;
            };
            let Some(bus_id) = self.pci_bus_id(self.api.pci_info, handle) else {
                continue;
            };
            let mut record = self.record(handle, bus_id.clone());
            record.index = Some(index);
            record.driver_version.clone_from(&driver_version);
            inventory.links.insert(bus_id, self.links(handle));
            inventory.gpus.push(record);
        }
        drop(session);
        inventory.gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        Ok(inventory)
    }

    fn record(&self, handle: Handle, bus_id: String) -> GpuRecord {
        let api = &self.api;
        let mig_enabled = api
            .mig_mode
            .and_then(|f| self.uint_pair(f, handle))
            .map(|(current, _pending)| current == MIG_ENABLED);
        GpuRecord {
            source: "nvml",
            bus_id,
            name: api
                .name
                .and_then(|f| self.device_string(f, handle, NAME_BUFFER)),
            uuid: api
                .uuid
                .and_then(|f| self.device_string(f, handle, NAME_BUFFER)),
            memory_bytes: api.memory.and_then(|f| self.memory_total(f, handle)),
            vbios: api
                .vbios
                .and_then(|f| self.device_string(f, handle, VBIOS_BUFFER)),
            compute_capability: api
                .compute_capability
                .and_then(|f| self.int_pair(f, handle))
                .and_then(|(major, minor)| {
                    Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?))
                }),
            mig_enabled,
            partitions: if mig_enabled == Some(true) {
                self.mig_partitions(handle)
            } else {
                Vec::new()
            },
            health: self.health(handle),
            ..GpuRecord::default()
        }
    }

    /// MIG devices: profile from the MIG device's name (`NVIDIA A100-SXM4-80GB MIG 3g.40gb`),
    /// UUID, memory. Empty slots answer "not found" and are skipped.
    fn mig_partitions(&self, handle: Handle) -> Vec<Partition> {
        let api = &self.api;
        let (Some(max_count), Some(mig_handle)) = (api.max_mig_devices, api.mig_handle) else {
            return Vec::new();
        };
        let slots = self.uint(max_count, handle).unwrap_or(0).min(MAX_DEVICES);
        (0..slots)
            .filter_map(|slot| self.child_handle(mig_handle, handle, slot))
            .map(|mig| {
                let name = api
                    .name
                    .and_then(|f| self.device_string(f, mig, NAME_BUFFER));
                let profile = name
                    .as_deref()
                    .and_then(|n| n.rsplit_once("MIG ").map(|(_, p)| p.trim().to_string()))
                    .or_else(|| {
                        api.gpu_instance_id
                            .and_then(|f| self.uint(f, mig))
                            .map(|id| format!("gpu-instance-{id}"))
                    })
                    .unwrap_or_else(|| "mig".to_string());
                Partition {
                    kind: "mig".into(),
                    profile,
                    id: api
                        .uuid
                        .and_then(|f| self.device_string(f, mig, NAME_BUFFER)),
                    memory_bytes: api.memory.and_then(|f| self.memory_total(f, mig)),
                }
            })
            .collect()
    }

    fn health(&self, handle: Handle) -> HealthFacts {
        let api = &self.api;
        let ecc_count = |error_type| {
            api.ecc_errors
                .and_then(|f| self.ecc_count(f, handle, error_type))
        };
        let retired_pages = api.retired_pages.and_then(|f| {
            RETIREMENT_CAUSES
                .iter()
                .map(|&cause| self.retired_page_count(f, handle, cause))
                .collect::<Option<Vec<u64>>>()
                .map(|counts| counts.iter().sum())
        });
        let remapped = api
            .remapped_rows
            .and_then(|f| self.remapped_rows(f, handle));
        HealthFacts {
            ecc_enabled: api
                .ecc_mode
                .and_then(|f| self.int_pair(f, handle))
                .map(|(current, _pending)| current == FEATURE_ENABLED),
            ecc_corrected: ecc_count(ERROR_CORRECTED),
            ecc_uncorrected: ecc_count(ERROR_UNCORRECTED),
            retired_pages,
            retirement_pending: api
                .retirement_pending
                .and_then(|f| self.enum_value(f, handle))
                .map(|state| state == FEATURE_ENABLED),
            remapped_rows: remapped.map(|[corrected, uncorrected, _, _]| {
                u64::from(corrected).saturating_add(u64::from(uncorrected))
            }),
            remap_pending: remapped.map(|[_, _, pending, _]| pending != 0),
            remap_failed: remapped.map(|[_, _, _, failed]| failed != 0),
            ..HealthFacts::default()
        }
    }

    /// Active links and what is at their far ends.
    fn links(&self, handle: Handle) -> GpuLinks {
        let api = &self.api;
        let mut links = GpuLinks::default();
        let Some(state) = api.nvlink_state else {
            return links;
        };
        let mut active = 0;
        for link in 0..NVLINK_MAX_LINKS {
            if self.link_enum(state, handle, link) != Some(FEATURE_ENABLED) {
                continue;
            }
            active += 1;
            let remote = api
                .nvlink_remote_pci
                .and_then(|f| self.link_pci_bus_id(f, handle, link));
            let kind = api
                .nvlink_remote_type
                .and_then(|f| self.link_enum(f, handle, link));
            match (kind, remote) {
                (Some(LINK_TO_SWITCH), Some(remote)) => {
                    links.switches.insert(remote);
                }
                (Some(LINK_TO_GPU) | None, Some(remote)) => {
                    *links.peers.entry(remote).or_insert(0) += 1;
                }
                _ => {}
            }
        }
        if active > 0 {
            links.active_links = Some(active);
        }
        links
    }
}

/// An initialised NVML; shut down when dropped (NVML counts inits, so this pairs with ours).
struct Session<'a> {
    nvml: &'a Nvml,
}

impl<'a> Session<'a> {
    fn start(nvml: &'a Nvml) -> Result<Self, String> {
        match nvml.call(nvml.api.init) {
            SUCCESS => Ok(Self { nvml }),
            status => Err(format!("nvmlInit_v2 returned {status}")),
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self.nvml.call(self.nvml.api.shutdown);
    }
}

// The calls. Each wrapper gives NVML writable buffers of the size it is told and reads
// outputs only on success; the function pointers and handles are valid per the module docs.
impl Nvml {
    #[allow(unsafe_code)]
    fn call(&self, f: InitFn) -> Return {
        // SAFETY: `f` is nvmlInit_v2 or nvmlShutdown, which take no arguments.
        unsafe { f() }
    }

    #[allow(unsafe_code)]
    fn count(&self, f: CountFn) -> Option<u32> {
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid, writable `unsigned int`.
        (unsafe { f(&mut count) } == SUCCESS).then_some(count)
    }

    #[allow(unsafe_code)]
    fn handle_by_index(&self, index: c_uint) -> Option<Handle> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid, writable `nvmlDevice_t`; NVML rejects a bad index.
        let status = unsafe { (self.api.handle_by_index)(index, &mut handle) };
        (status == SUCCESS && !handle.is_null()).then_some(handle)
    }

    #[allow(unsafe_code)]
    fn child_handle(&self, f: ChildHandleFn, parent: Handle, index: c_uint) -> Option<Handle> {
        let mut child: Handle = std::ptr::null_mut();
        // SAFETY: `parent` came from NVML in this session; `child` is a writable handle slot.
        let status = unsafe { f(parent, index, &mut child) };
        (status == SUCCESS && !child.is_null()).then_some(child)
    }

    #[allow(unsafe_code)]
    fn pci_bus_id(&self, f: PciInfoFn, handle: Handle) -> Option<String> {
        let mut info = PciInfo::zeroed();
        // SAFETY: `info` is a writable `nvmlPciInfo_t` with the header's layout.
        (unsafe { f(handle, &mut info) } == SUCCESS)
            .then(|| info.canonical_bus_id())
            .flatten()
    }

    #[allow(unsafe_code)]
    fn link_pci_bus_id(&self, f: LinkPciFn, handle: Handle, link: c_uint) -> Option<String> {
        let mut info = PciInfo::zeroed();
        // SAFETY: as for `pci_bus_id`; NVML rejects a link index the GPU does not have.
        (unsafe { f(handle, link, &mut info) } == SUCCESS)
            .then(|| info.canonical_bus_id())
            .flatten()
    }

    #[allow(unsafe_code)]
    fn system_string(&self, f: SystemStringFn, capacity: usize) -> Option<String> {
        let mut buffer: Vec<c_char> = vec![0; capacity];
        let length = c_uint::try_from(capacity).ok()?;
        // SAFETY: `buffer` holds `length` writable bytes; NVML writes at most that many.
        (unsafe { f(buffer.as_mut_ptr(), length) } == SUCCESS)
            .then(|| c_string(&buffer))
            .flatten()
    }

    #[allow(unsafe_code)]
    fn device_string(&self, f: DeviceStringFn, handle: Handle, capacity: usize) -> Option<String> {
        let mut buffer: Vec<c_char> = vec![0; capacity];
        let length = c_uint::try_from(capacity).ok()?;
        // SAFETY: `buffer` holds `length` writable bytes; NVML writes at most that many.
        (unsafe { f(handle, buffer.as_mut_ptr(), length) } == SUCCESS)
            .then(|| c_string(&buffer))
            .flatten()
    }

    #[allow(unsafe_code)]
    fn memory_total(&self, f: MemoryFn, handle: Handle) -> Option<u64> {
        let mut memory = Memory::default();
        // SAFETY: `memory` is a writable `nvmlMemory_t` with the header's layout.
        (unsafe { f(handle, &mut memory) } == SUCCESS).then_some(memory.total)
    }

    #[allow(unsafe_code)]
    fn int_pair(&self, f: IntPairFn, handle: Handle) -> Option<(c_int, c_int)> {
        let (mut first, mut second): (c_int, c_int) = (0, 0);
        // SAFETY: both outputs are writable `int`s (NVML enums are `int`-sized).
        (unsafe { f(handle, &mut first, &mut second) } == SUCCESS).then_some((first, second))
    }

    #[allow(unsafe_code)]
    fn uint_pair(&self, f: UintPairFn, handle: Handle) -> Option<(c_uint, c_uint)> {
        let (mut first, mut second): (c_uint, c_uint) = (0, 0);
        // SAFETY: both outputs are writable `unsigned int`s.
        (unsafe { f(handle, &mut first, &mut second) } == SUCCESS).then_some((first, second))
    }

    #[allow(unsafe_code)]
    fn uint(&self, f: UintFn, handle: Handle) -> Option<c_uint> {
        let mut value: c_uint = 0;
        // SAFETY: `value` is a writable `unsigned int`.
        (unsafe { f(handle, &mut value) } == SUCCESS).then_some(value)
    }

    #[allow(unsafe_code)]
    fn enum_value(&self, f: EnumFn, handle: Handle) -> Option<c_int> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a writable `int`-sized enum slot.
        (unsafe { f(handle, &mut value) } == SUCCESS).then_some(value)
    }

    #[allow(unsafe_code)]
    fn link_enum(&self, f: LinkEnumFn, handle: Handle, link: c_uint) -> Option<c_int> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a writable `int`-sized enum slot; NVML rejects a bad link index.
        (unsafe { f(handle, link, &mut value) } == SUCCESS).then_some(value)
    }

    #[allow(unsafe_code)]
    fn ecc_count(&self, f: EccCountFn, handle: Handle, error_type: c_int) -> Option<u64> {
        let mut count: c_ulonglong = 0;
        // SAFETY: `count` is a writable `unsigned long long`; the enums are valid values.
        (unsafe { f(handle, error_type, VOLATILE_ECC, &mut count) } == SUCCESS).then_some(count)
    }

    #[allow(unsafe_code)]
    fn retired_page_count(&self, f: RetiredPagesFn, handle: Handle, cause: c_int) -> Option<u64> {
        let mut addresses: Vec<c_ulonglong> = vec![0; RETIRED_PAGES_BUFFER];
        let mut count = c_uint::try_from(addresses.len()).ok()?;
        // SAFETY: `addresses` holds `count` writable entries, the capacity NVML is told; it
        // writes at most that many and sets `count` to the total when there are more.
        let status = unsafe { f(handle, cause, &mut count, addresses.as_mut_ptr()) };
        matches!(status, SUCCESS | ERROR_INSUFFICIENT_SIZE).then_some(u64::from(count))
    }

    #[allow(unsafe_code)]
    fn remapped_rows(&self, f: RemappedRowsFn, handle: Handle) -> Option<[c_uint; 4]> {
        let mut out: [c_uint; 4] = [0; 4];
        let [corrected, uncorrected, pending, failed] = &mut out;
        // SAFETY: the four outputs are distinct writable `unsigned int`s.
        let status = unsafe { f(handle, corrected, uncorrected, pending, failed) };
        (status == SUCCESS).then_some(out)
    }
}

#[allow(unsafe_code)]
fn open_library(file: &OsStr) -> Result<Library, String> {
    // SAFETY: loading runs the library's initialisers. The library is NVML from the host's
    // driver (loaded only when the host root is `/`) or a test's fake; neither has
    // initialisers that touch our process state.
    unsafe { Library::new(file) }.map_err(|err| err.to_string())
}

#[allow(unsafe_code)]
fn symbol<T: Copy>(library: &Library, name: &str) -> Option<T> {
    // SAFETY: every call site names `T` as the exact function type nvml.h declares for
    // `name` (see `Api`); the copied pointer is only used while `library` is loaded.
    unsafe { library.get::<T>(name.as_bytes()) }
        .ok()
        .map(|symbol| *symbol)
}

/// A NUL-terminated C string in a fixed buffer; `None` when empty or unterminated.
fn c_string(buffer: &[c_char]) -> Option<String> {
    let bytes: Vec<u8> = buffer.iter().map(|&c| c.to_ne_bytes()[0]).collect();
    let text = CStr::from_bytes_until_nul(&bytes).ok()?.to_string_lossy();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

// The one builder of the fake library, shared with tests/nvml_glibc.rs.
#[cfg(test)]
#[path = "../../../../../tests/support/fake_nvml.rs"]
mod fake_nvml;

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    /// Compiles the fake library into `dir` with `defines` (`-DFAKE_NVML_NO_DRIVER`...).
    pub(crate) fn build_fake(dir: &Path, defines: &[&str]) -> PathBuf {
        super::fake_nvml::build_fake_nvml(dir, defines)
    }

    #[test]
    fn reads_the_fake_library() {
        let dir = tempfile::tempdir().unwrap();
        let nvml = Nvml::load_from(&build_fake(dir.path(), &[])).unwrap();
        let inventory = nvml.inventory().unwrap();
        assert_eq!(inventory.gpus.len(), 2);
        let first = &inventory.gpus[0];
        assert_eq!(first.bus_id, "0000:07:00.0");
        assert_eq!(first.index, Some(0));
        assert_eq!(first.name.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(first.memory_bytes, Some(81920 << 20));
        assert_eq!(first.compute_capability, Some((8, 0)));
        assert_eq!(first.driver_version.as_deref(), Some("535.183.01"));
        assert_eq!(first.vbios.as_deref(), Some("92.00.36.00.02"));
        assert_eq!(first.mig_enabled, Some(true));
        let profiles: Vec<&str> = first
            .partitions
            .iter()
            .map(|p| p.profile.as_str())
            .collect();
        assert_eq!(
            profiles,
            ["3g.40gb", "1g.10gb"],
            "empty MIG slots are skipped"
        );
        assert_eq!(first.partitions[0].memory_bytes, Some(40192 << 20));
        assert!(
            first.partitions[0]
                .id
                .as_deref()
                .unwrap()
                .starts_with("MIG-")
        );
        // The fake has no retired-page entry points and MIG blocks row remapping here.
        assert_eq!(first.health.retired_pages, None);
        assert_eq!(first.health.remapped_rows, None);
        assert_eq!(first.health.ecc_uncorrected, Some(0));
        let second = &inventory.gpus[1];
        assert_eq!(second.bus_id, "0000:4e:00.0");
        assert_eq!(second.mig_enabled, Some(false));
        assert!(second.partitions.is_empty());
        assert_eq!(second.health.ecc_uncorrected, Some(2));
        assert_eq!(second.health.remapped_rows, Some(1));
        assert_eq!(second.health.remap_pending, Some(false));
        let links = &inventory.links["0000:4e:00.0"];
        assert_eq!(links.active_links, Some(12));
        assert!(links.peers.is_empty());
        assert_eq!(links.switches.len(), 6);
    }

    #[test]
    fn a_library_without_a_driver_fails_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let nvml = Nvml::load_from(&build_fake(dir.path(), &["-DFAKE_NVML_NO_DRIVER"])).unwrap();
        let err = nvml.inventory().unwrap_err();
        assert!(err.contains("nvmlInit_v2 returned 9"), "{err}");
    }

    #[test]
    fn a_library_without_the_required_entry_points_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("empty.c");
        std::fs::write(&source, "int not_nvml(void) { return 0; }\n").unwrap();
        let library = dir.path().join("libempty.so");
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .status()
            .unwrap();
        assert!(status.success());
        let err = Nvml::load_from(&library).unwrap_err();
        assert!(err.contains("nvmlInit_v2"), "{err}");
        assert!(Nvml::load_from(&dir.path().join("missing.so")).is_err());
    }

    #[test]
    fn reads_c_strings_from_fixed_buffers() {
        let mut buffer = [0 as c_char; 8];
        for (slot, byte) in buffer.iter_mut().zip(b"  9.0 ") {
            *slot = *byte as c_char;
        }
        assert_eq!(c_string(&buffer).as_deref(), Some("9.0"));
        assert_eq!(c_string(&[0; 4]), None);
        assert_eq!(c_string(&[b'a' as c_char; 4]), None, "no terminator");
    }
}
