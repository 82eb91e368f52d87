//! A training program that fails keeps its workers' logs and says where:
//! the program's own local cluster directory stays (in `TMPDIR`) instead
//! of going with the program.

use std::path::Path;
use std::time::Duration;

/// How long the failing run may take: it fails when its workers try to
/// form their group, seconds after they start.
const DEADLINE: Duration = Duration::from_secs(60);

/// `train_mnist` asked for NCCL where CUDA sees no device (as on a machine
/// without a GPU, or a GPU run whose group cannot form) exits non-zero,
/// naming the NCCL group, and keeps its local cluster's directory with a
/// log per worker.
#[tokio::test]
async fn a_failed_training_run_keeps_its_workers_logs_and_says_where() {
    let program = Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples/train_mnist");
    assert!(
        program.exists(),
        "{} is not built: `cargo build --workspace --examples` first (`make test` does)",
        program.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(&program)
        .args(["--workers", "2", "--epochs", "1", "--collective", "nccl"])
        .env("NIMBUS_BIN", env!("CARGO_BIN_EXE_nimbus"))
        .env("TMPDIR", tmp.path())
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("NIMBUS_ADDRESS")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap_or_else(|_| panic!("train_mnist still runs after {DEADLINE:?}"))
        .unwrap();
    let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("cannot form an NCCL group"), "{stderr}");
    let kept = stderr
        .lines()
        .find_map(|line| line.split_once("are kept in ").map(|(_, dir)| dir))
        .unwrap_or_else(|| panic!("where the files are kept: {stderr}"));
    assert!(kept.starts_with(tmp.path().to_str().unwrap()), "{kept}");
    let workers = std::fs::read_dir(Path::new(kept).join("logs"))
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("worker-")
        })
        .count();
    assert!(
        workers >= 2,
        "a log per worker is kept: {workers} in {kept}"
    );
}
