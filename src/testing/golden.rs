//! Golden files: output compared with a committed file under `fixtures/golden/`, rewritten
//! on request (`HWACCEL_BLESS=1`) so an intended change is one reviewed diff.

use std::path::PathBuf;

/// Compares `actual` with the committed `fixtures/golden/<name>`; with `HWACCEL_BLESS=1` in
/// the environment it rewrites the file instead (review the diff before committing).
pub fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/golden")
        .join(name);
    if std::env::var_os("HWACCEL_BLESS").is_some() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create fixtures/golden");
        }
        std::fs::write(&path, actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from the output; if the change is intended, rerun with HWACCEL_BLESS=1\n\
         --- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
