//! The workers' flight records after a failure: the launcher says where they are.

/// After a failure: where the workers' flight records are (`kolo diagnose DIR` reads them).
pub(crate) fn report(job_id: &str, nproc: usize, since: std::time::SystemTime) {
    let dir = kolo_core::settings::trace_dir(&kolo_core::settings::ProcessEnv, job_id);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let fresh = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("rank-") && name.ends_with(".json")
        })
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since)
        })
        .count();
    if fresh > 0 {
        crate::supervise::report(format_args!(
            "flight records of {fresh} of this node's {nproc} workers are in {}: `kolo diagnose {}` tells which rank stopped where",
            dir.display(),
            dir.display()
        ));
    }
}
