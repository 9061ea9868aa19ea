//! The scale bench's fit (`benches/fit_lstsq.py`, `benches/scale_cpu.py`) has its own Python
//! tests (`benches/test_fit_*.py`): a fit that recovers designed costs, never a negative one,
//! and held-out runs predicted from their measured rates. They run here so that `cargo test`
//! covers them as it covers the rest.

use std::process::Command;

#[test]
fn the_scale_fits_python_tests_pass() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .args([
            "-m",
            "unittest",
            "discover",
            "-s",
            "benches",
            "-p",
            "test_fit_*.py",
        ])
        .current_dir(root)
        .output()
        .expect("python3 runs the scale fit's tests (Python 3.8 or later is needed)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "benches/test_fit_*.py failed:\n{said}"
    );
    assert!(said.contains("OK"), "no tests ran:\n{said}");
}
