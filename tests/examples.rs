//! The example ModelPlacements in `manifests/examples/` parse as ModelPlacements and are
//! accepted by the controller's validation without notes (a note means a field is ignored).

use std::path::Path;

use hwaccel::api::ModelPlacement;
use hwaccel::controller::placement::core::request::request_from_spec;

#[test]
fn every_example_placement_is_valid_and_fully_applied() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let placement: ModelPlacement =
            serde_saphyr::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        let request = request_from_spec(&placement.spec)
            .unwrap_or_else(|reasons| panic!("{}: {reasons:?}", path.display()));
        assert!(
            request.notes.is_empty(),
            "{}: {:?}",
            path.display(),
            request.notes
        );
        seen += 1;
    }
    assert!(seen >= 3, "only {seen} examples found in {}", dir.display());
}
