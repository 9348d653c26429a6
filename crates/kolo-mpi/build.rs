//! Compiles the one C constant rsmpi does not export: `MPI_IN_PLACE` (a different sentinel pointer in
//! OpenMPI and MPICH), so in-place collectives need no copy.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for e in errs {
                println!("cargo:warning=looking for MPI: {e}");
            }
            panic!(
                "kolo-mpi needs an MPI library with its headers (Debian: apt-get install \
                 libopenmpi-dev openmpi-bin libclang-dev)"
            );
        }
    };
    let mut build = cc::Build::new();
    build.file("src/shim.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for inc in &lib.include_paths {
                build.include(inc);
            }
        }
    }
    build.compile("kolo_mpi_shim");
}
