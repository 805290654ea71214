//! The Dockerfile's two images, checked without a Docker engine: the default build (`docker
//! build .`, the last stage) is the static musl image, and `--target glibc` is the glibc build
//! on distroless/cc that can load NVML. Both run the same binary the same way (uid 65532,
//! entrypoint `/hwaccel`). A renamed stage, a swapped base image or target, or a drifted user
//! breaks this test rather than the chart's NVIDIA pools (which pull the `-glibc` tag).

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
