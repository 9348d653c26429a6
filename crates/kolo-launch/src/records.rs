//! The workers' flight records after a failure: the launcher says where they are.

/// After a failure: where the workers' flight records are (`kolo diagnose DIR` reads them).
pub(crate) fn report(job_id: &str, nproc: usize, since: std::time::SystemTime) {
    let dir = kolo_core::settings::trace_dir(&kolo_core::settings::ProcessEnv, job_id);
    let fresh = kolo_core::settings::fresh_flight_records(&dir, since);
    if fresh > 0 {
        crate::supervise::report(format_args!(
            "flight records of {fresh} of this node's {nproc} workers are in {}: `kolo diagnose {}` tells which rank stopped where",
            dir.display(),
            dir.display()
        ));
    }
}
