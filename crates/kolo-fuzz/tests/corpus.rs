//! Replays every committed input through its fuzz target: the seed corpus (which must match what
//! kolo's encoders make today) and the regression inputs (inputs the fuzzer once found crashing a
//! decoder, fixed since).

use std::path::{Path, PathBuf};

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target)
}

#[test]
fn every_target_has_a_corpus_and_replays_it_and_its_regressions() -> Result<(), String> {
    for (name, target, _) in kolo_fuzz::TARGETS {
        let mut paths = vec![dir("corpus", name)];
        let regressions = dir("regressions", name);
        if regressions.is_dir() {
            paths.push(regressions);
        }
        let n = kolo_fuzz::replay(*target, &paths).map_err(|e| format!("{name}: {e}"))?;
        assert!(n > 0, "target {name} has no corpus");
    }
    Ok(())
}

#[test]
fn committed_seeds_are_what_the_encoders_make() -> Result<(), String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (name, _, seeds) in kolo_fuzz::TARGETS {
        for (file, data) in seeds(scratch.path())? {
            let path = dir("corpus", name).join(&file);
            let committed = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            assert!(
                committed == data,
                "{} differs from the encoders' seed: regenerate with \
                 `cargo run -p kolo-fuzz --bin fuzz-{name} -- --seeds {}`",
                path.display(),
                dir("corpus", name).display()
            );
        }
    }
    Ok(())
}
