//! Running this test binary's ignored entry points as the ranks of an `mpirun` job (also included
//! by kolo-ddp's DDP test).
#![allow(dead_code)]

/// What `mpirun` printed and how it ended.
pub struct MpiRun {
    pub success: bool,
    pub text: String,
    pub elapsed: std::time::Duration,
}

/// Runs the ignored test `test` of this test binary as `n` ranks under `mpirun`, with `env` set.
pub fn mpirun_with(n: usize, test: &str, env: &[(&str, &str)]) -> MpiRun {
    let exe = std::env::current_exe().expect("test binary");
    let started = std::time::Instant::now();
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ])
    .arg(&exe)
    .args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("RANK")
    .env_remove("WORLD_SIZE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .expect("mpirun (Debian: apt-get install openmpi-bin libopenmpi-dev)");
    MpiRun {
        success: out.status.success(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        elapsed: started.elapsed(),
    }
}

/// Runs the ignored test `test` of this test binary as `n` ranks under `mpirun` and fails with its
/// output unless every rank passes.
pub fn mpirun(n: usize, test: &str) {
    let run = mpirun_with(n, test, &[]);
    assert!(run.success, "mpirun -n {n} {test} failed:\n{}", run.text);
    // The ranks share one pipe and libtest writes "test result: ", "ok" and ". 1 passed; 0
    // failed; ..." separately, so another rank's output may land in between: count the part that
    // is written at once.
    let passed = run.text.matches("1 passed; 0 failed").count();
    assert_eq!(
        passed, n,
        "mpirun -n {n} {test}: expected {n} ranks to pass:\n{}",
        run.text
    );
}
