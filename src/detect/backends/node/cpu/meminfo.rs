//! Memory from `/proc/meminfo` (`MemTotal`), and the `<n> kB` values that file and the per-node
//! `meminfo` of `/sys/devices/system/node` share.

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    parse_kib_value(line.strip_prefix("MemTotal:")?)
}

/// `  32386544 kB` as bytes. The kernel's `kB` means KiB.
pub(crate) fn parse_kib_value(text: &str) -> Option<u64> {
    let mut words = text.split_ascii_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    match words.next() {
        None | Some("kB") => number.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_meminfo() {
        let text = include_str!("../../../../../fixtures/hosts/cpu-only-vm/proc/meminfo");
        assert_eq!(parse_meminfo_total(text), Some(32_386_544 * 1024));
        assert_eq!(parse_meminfo_total("MemTotal: lots"), None);
        assert_eq!(parse_meminfo_total("MemTotal: 5 MB"), None);
    }

    proptest! {
        #[test]
        fn parse_meminfo_total_never_panics(s in ".*") {
            let _ = parse_meminfo_total(&s);
        }
    }
}
