//! `kolo run` naming the root cause of a failed job by what the workers recorded: each worker's
//! error file (`TORCHELASTIC_ERROR_FILE`, as kolo's communicators write it) is shown under the
//! headline, and its time tells which rank failed first when the ranks exit in another order.

use std::process::Stdio;

mod common;

use common::{kolo, stderr};

/// A shell function writing an error record as kolo does (`KoloError: <message>`, the moment to
/// the nanosecond), once.
const RECORD: &str = r#"
    record() {
        printf '{"message": {"message": "KoloError: %s", "extraInfo": {"py_callstack": "", "timestamp": "0", "kolo_unix_ns": "%s"}}}' \
            "$1" "$(date +%s%N)" > "$TORCHELASTIC_ERROR_FILE.tmp"
        mv "$TORCHELASTIC_ERROR_FILE.tmp" "$TORCHELASTIC_ERROR_FILE"
    }
"#;

/// Runs `script` (after [`RECORD`]) as 2 workers with `DIR` a fresh directory; exit code and
/// stderr.
fn run_two(script: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = kolo()
        .args(["run", "-n", "2", "--", "sh", "-c"])
        .arg(format!("{RECORD}\n{script}"))
        .env("DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("the kolo binary starts");
    (out.status.code(), stderr(&out))
}

fn headline(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.contains(") failed: ")).collect()
}

#[test]
fn the_root_causes_recorded_error_is_shown_under_the_headline() {
    let (code, err) = run_two(
        r#"
        if [ "$RANK" = 1 ]; then
            record "rank 1: all_reduce: buffer \`recv\` has 3 elements, expected 4\nthe second line"
            exit 3
        fi
        sleep 5
    "#,
    );
    assert_eq!(code, Some(3), "stderr: {err}");
    let failed = headline(&err);
    assert!(
        failed.len() == 1 && failed[0].starts_with("kolo run: rank 1 (pid "),
        "stderr: {err}"
    );
    assert!(
        err.contains(
            "kolo run: rank 1's error: all_reduce: buffer `recv` has 3 elements, \
             expected 4\n    the second line\n"
        ),
        "stderr: {err}"
    );
}

#[test]
fn a_rank_that_recorded_its_error_first_is_blamed_though_it_exits_last() {
    // Rank 0 records its error (as a rank whose call fails its own checks does before it aborts
    // the others), then takes its time to exit; rank 1 records the consequence and exits at once.
    let (code, err) = run_two(
        r#"
        trap '' TERM
        if [ "$RANK" = 0 ]; then
            record "rank 0: the first error"
            touch "$DIR/recorded"
            sleep 0.5
            exit 1
        fi
        while [ ! -e "$DIR/recorded" ]; do sleep 0.005; done
        sleep 0.05
        record "rank 1: aborted by rank 0"
        exit 1
    "#,
    );
    assert_eq!(code, Some(1), "stderr: {err}");
    let failed = headline(&err);
    assert!(
        failed.len() == 1 && failed[0].starts_with("kolo run: rank 0 (pid "),
        "stderr: {err}"
    );
    assert!(
        err.contains("kolo run: rank 0's error: the first error\n"),
        "stderr: {err}"
    );
    assert!(
        err.contains("kolo run: also failed: rank 1 (exit code 1)"),
        "stderr: {err}"
    );
}

#[test]
fn a_rank_that_failed_first_without_a_record_stays_blamed() {
    // Rank 0 exits with an error it never records; rank 1 records its loss afterwards.
    let (code, err) = run_two(
        r#"
        trap '' TERM
        if [ "$RANK" = 0 ]; then
            echo $$ > "$DIR/r0.tmp" && mv "$DIR/r0.tmp" "$DIR/r0"
            sleep 0.1
            exit 2
        fi
        while [ ! -s "$DIR/r0" ]; do sleep 0.005; done
        while kill -0 "$(cat "$DIR/r0")" 2>/dev/null; do sleep 0.001; done
        record "rank 1: lost rank 0"
        exit 1
    "#,
    );
    assert_eq!(code, Some(2), "stderr: {err}");
    let failed = headline(&err);
    assert!(
        failed.len() == 1 && failed[0].starts_with("kolo run: rank 0 (pid "),
        "stderr: {err}"
    );
    assert!(!err.contains("'s error: "), "stderr: {err}");
}
