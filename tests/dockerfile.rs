//! The Dockerfile's two images, checked without a Docker engine: the default build (`docker
//! build .`, the last stage) is the static musl image, and `--target glibc` is the glibc build
//! on distroless/cc that can load NVML. Both run the same binary the same way (uid 65532,
//! entrypoint `/hwaccel`). A renamed stage, a swapped base image or target, or a drifted user
//! breaks this test rather than the chart's NVIDIA pools (which pull the `-glibc` tag).

#![allow(clippy::expect_used)] // helpers that parse the files under test may panic on a malformed one

use std::path::Path;

/// One `FROM` stage: its base image, its name, and its instructions (continuations joined).
#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    instructions: Vec<String>,
}

fn dockerfile() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Splits the Dockerfile into stages. Comments are dropped, `\`-continued lines joined.
fn stages(text: &str) -> Vec<Stage> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        let words: Vec<&str> = instruction.split_whitespace().collect();
        if words
            .first()
            .is_some_and(|word| word.eq_ignore_ascii_case("FROM"))
        {
            let base = words
                .get(1)
                .map(|word| (*word).to_string())
                .unwrap_or_default();
            let name = match words.get(2..4) {
                Some([r#as, name]) if r#as.eq_ignore_ascii_case("AS") => Some((*name).to_string()),
                _ => None,
            };
            stages.push(Stage {
                base,
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        }
    }
    stages
}

fn stage<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
    stages
        .iter()
        .find(|stage| stage.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no stage named {name}: {stages:#?}"))
}

fn has(stage: &Stage, instruction: &str) -> bool {
    stage.instructions.iter().any(|line| line == instruction)
}

#[test]
fn the_default_image_is_the_static_build_on_distroless_static() {
    let stages = stages(&dockerfile());
    let last = stages.last().expect("a stage");
    assert_eq!(
        last.base, "gcr.io/distroless/static-debian12:nonroot",
        "`docker build .` builds the last stage: it must stay the static image"
    );
    assert_eq!(last.name.as_deref(), Some("static"));
    assert!(
        has(last, "COPY --from=build /out/hwaccel /hwaccel"),
        "{last:#?}"
    );
    let build = stage(&stages, "build");
    assert!(
        build.base.starts_with("docker.io/library/rust:"),
        "{build:#?}"
    );
    assert!(
        build
            .instructions
            .iter()
            .any(|line| line.contains("-unknown-linux-musl") && line.contains("cargo build")),
        "the default image's binary is built for the musl target: {build:#?}"
    );
}

#[test]
fn the_glibc_target_builds_for_gnu_on_distroless_cc() {
    let stages = stages(&dockerfile());
    let glibc = stage(&stages, "glibc");
    assert_eq!(glibc.base, "gcr.io/distroless/cc-debian12:nonroot");
    assert!(
        has(glibc, "COPY --from=build-glibc /out/hwaccel /hwaccel"),
        "{glibc:#?}"
    );
    let build = stage(&stages, "build-glibc");
    // Bookworm's glibc is the one distroless/cc-debian12 ships: a newer build glibc could
    // need symbols the runtime image lacks.
    assert!(
        build.base.starts_with("docker.io/library/rust:") && build.base.ends_with("-bookworm"),
        "{build:#?}"
    );
    let cargo = build
        .instructions
        .iter()
        .find(|line| line.contains("cargo build"))
        .expect("the glibc stage builds the binary");
    assert!(cargo.contains("-unknown-linux-gnu"), "{cargo}");
    assert!(
        cargo.contains("--bin hwaccel") && cargo.contains("--locked"),
        "{cargo}"
    );
    assert!(
        cargo.contains("ldd /out/hwaccel"),
        "the build checks the binary links glibc: {cargo}"
    );
}

#[test]
fn both_images_run_the_same_binary_as_the_same_user() {
    let stages = stages(&dockerfile());
    for name in ["static", "glibc"] {
        let image = stage(&stages, name);
        assert!(has(image, "USER 65532:65532"), "{name}: {image:#?}");
        assert!(
            has(image, r#"ENTRYPOINT ["/hwaccel"]"#),
            "{name}: {image:#?}"
        );
        assert!(
            !image
                .instructions
                .iter()
                .any(|line| line.starts_with("RUN ")),
            "{name}: a distroless runtime stage has no shell to RUN anything"
        );
    }
}

#[test]
fn the_header_documents_both_builds() {
    let text = dockerfile();
    let header: Vec<&str> = text
        .lines()
        .take_while(|line| line.starts_with('#') || line.is_empty())
        .collect();
    let header = header.join("\n");
    assert!(header.contains("docker build -t "), "{header}");
    assert!(
        header.contains("docker build --target glibc -t "),
        "{header}"
    );
    assert!(header.contains("-glibc ."), "{header}");
}

/// The `KEY="value"` pairs of a stage's `LABEL` instructions.
fn labels(stage: &Stage) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for line in &stage.instructions {
        let Some(mut rest) = line.strip_prefix("LABEL ") else {
            continue;
        };
        while let Some((key, after)) = rest.trim_start().split_once("=\"") {
            let (value, tail) = after.split_once('"').expect("a closed label value");
            out.insert(key.trim().to_string(), value.to_string());
            rest = tail;
        }
    }
    out
}

/// The files of an uncompressed tar archive (ustar headers; what scripts/oci-image.py writes).
fn untar(bytes: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut at = 0;
    while at + 512 <= bytes.len() && bytes[at] != 0 {
        let header = &bytes[at..at + 512];
        let field = |range: std::ops::Range<usize>| {
            String::from_utf8_lossy(&header[range])
                .trim_matches(char::from(0))
                .trim()
                .to_string()
        };
        let name = field(0..100);
        let size = usize::from_str_radix(&field(124..136), 8).expect("an octal size");
        let data = bytes[at + 512..at + 512 + size].to_vec();
        if header[156] == b'0' || header[156] == 0 {
            files.insert(name, data);
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    files
}

fn blob(files: &std::collections::BTreeMap<String, Vec<u8>>, digest: &str) -> serde_json::Value {
    let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    serde_json::from_slice(files.get(&name).unwrap_or_else(|| panic!("no {name}")))
        .expect("a JSON blob")
}

/// `make image` (scripts/oci-image.py, no container engine) and the Dockerfile describe the
/// same two images: stage names, entrypoint, user and labels. The binaries here are stand-ins
/// (the layout is what is compared, not the program).
#[test]
fn make_image_builds_the_images_the_dockerfile_describes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stages = stages(&dockerfile());
    let dir = tempfile::tempdir().expect("a temp dir");
    let dummy = dir.path().join("hwaccel");
    std::fs::write(&dummy, b"#!/bin/false\n").expect("a stand-in binary");
    // The glibc image copies what its binary links: any dynamically linked program will do.
    for (name, binary) in [
        ("static", dummy.as_path()),
        ("glibc", Path::new("/bin/true")),
    ] {
        let out = dir.path().join(format!("{name}.tar"));
        let status = std::process::Command::new("python3")
            .arg(root.join("scripts/oci-image.py"))
            .args(["--stage", name, "--binary"])
            .arg(binary)
            .args(["--name", "example.test/hwaccel:1", "--out"])
            .arg(&out)
            .status()
            .expect("python3 runs scripts/oci-image.py");
        assert!(status.success(), "{name}: oci-image.py failed");
        let files = untar(&std::fs::read(&out).expect("the archive"));
        let index: serde_json::Value =
            serde_json::from_slice(&files["index.json"]).expect("index.json");
        let manifest = blob(
            &files,
            index["manifests"][0]["digest"].as_str().expect("digest"),
        );
        assert_eq!(manifest["annotations"]["hwaccel.io/stage"], name);
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "example.test/hwaccel:1"
        );
        let config = blob(
            &files,
            manifest["config"]["digest"].as_str().expect("digest"),
        );
        let image = stage(&stages, name);
        assert!(
            has(
                image,
                &format!("USER {}", config["config"]["User"].as_str().expect("User"))
            ),
            "{name}: user {} is not the Dockerfile's",
            config["config"]["User"]
        );
        assert!(
            has(
                image,
                &format!("ENTRYPOINT {}", config["config"]["Entrypoint"])
            ),
            "{name}: entrypoint {} is not the Dockerfile's",
            config["config"]["Entrypoint"]
        );
        let from_make: std::collections::BTreeMap<String, String> =
            serde_json::from_value(config["config"]["Labels"].clone()).expect("labels");
        assert_eq!(from_make, labels(image), "{name}: labels differ");
        let layer = untar(
            &files[&format!(
                "blobs/sha256/{}",
                manifest["layers"][0]["digest"]
                    .as_str()
                    .expect("digest")
                    .trim_start_matches("sha256:")
            )],
        );
        assert!(
            layer.contains_key("hwaccel"),
            "{name}: no /hwaccel in the layer"
        );
        if name == "glibc" {
            assert!(
                layer.keys().any(|path| path.contains("libc.so.6")),
                "the glibc image carries the libc its binary links: {:?}",
                layer.keys().collect::<Vec<_>>()
            );
        }
    }
}

/// The Dockerfile builds with the toolchain rust-toolchain.toml pins for CI and `make image`.
#[test]
fn the_dockerfile_builds_with_the_pinned_toolchain() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pin =
        std::fs::read_to_string(root.join("rust-toolchain.toml")).expect("rust-toolchain.toml");
    let channel = pin
        .lines()
        .find_map(|line| line.trim().strip_prefix("channel = "))
        .expect("a channel")
        .trim_matches('"')
        .to_string();
    assert!(
        channel.split('.').count() == 3,
        "the pin names an exact release, not {channel}"
    );
    assert!(
        dockerfile()
            .lines()
            .any(|line| line == format!("ARG RUST_VERSION={channel}")),
        "the Dockerfile's RUST_VERSION is not {channel}"
    );
}
