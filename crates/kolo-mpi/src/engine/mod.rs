//! [`MpiEngine`]: every kolo collective as the MPI library's own collective.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

use kolo_core::settings::{Env, ProcessEnv};
use kolo_core::{DType, Engine, Error, Header, ReduceOp, Reducer, Result};
use mpi::ffi;

use crate::runtime::{self, check, Comm, Watch};
use crate::types::{datatype, in_place, operator};

mod agree;
mod half_precision;

use half_precision::{bytes_of, bytes_of_mut, HalfMode};

/// Collectives on an MPI communicator (a duplicate: kolo's calls never mix with the program's own).
///
/// Its communicators are never freed (MPI frees them at `MPI_Finalize`): a freed context id can be
/// reused by the next communicator while a late message of the old one (a peer's closing notice,
/// say) is still queued, which would then be delivered to the wrong communicator.
#[derive(Debug)]
pub struct MpiEngine {
    /// The collectives' communicator.
    comm: Comm,
    /// Where the ranks agree on each call's fingerprint before running it.
    agree: Comm,
    rank: usize,
    size: usize,
    /// World rank of each member.
    members: Vec<usize>,
    watch: Arc<Watch>,
    half: HalfMode,
}

/// A count or displacement as MPI's `int`.
fn int(op: &'static str, rank: usize, arg: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        rank,
        arg,
        reason: format!(
            "{v} elements is over MPI's limit of {} per call",
            c_int::MAX
        ),
    })
}

impl MpiEngine {
    /// An engine over a duplicate of `MPI_COMM_WORLD` (MPI must be started).
    pub(crate) fn world(watch: Arc<Watch>) -> Result<MpiEngine> {
        // SAFETY: reading the world handle rsmpi exports.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        let comm = runtime::dup(world, "init", 0)?;
        MpiEngine::over(comm, watch)
    }

    /// Takes ownership of `comm` (collective over it): makes its companion for the agreement step
    /// and learns the members' world ranks.
    fn over(comm: Comm, watch: Arc<Watch>) -> Result<MpiEngine> {
        let (rank, size) = runtime::rank_size(comm.0, "init")?;
        // SAFETY: reading the world handle rsmpi exports.
        let (world_rank, _) = runtime::rank_size(unsafe { ffi::RSMPI_COMM_WORLD }, "init")?;
        let mine = world_rank as u64;
        let mut all = vec![0u64; size];
        // SAFETY: one u64 from each rank into `all`.
        let rc = unsafe {
            ffi::MPI_Allgather(
                &mine as *const u64 as *const c_void,
                1,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr() as *mut c_void,
                1,
                ffi::RSMPI_UINT64_T,
                comm.0,
            )
        };
        check(rc, "init", rank)?;
        let agree = runtime::dup(comm.0, "init", rank)?;
        Ok(MpiEngine {
            comm,
            agree,
            rank,
            size,
            members: all.into_iter().map(|w| w as usize).collect(),
            watch,
            half: HalfMode::from_lookup(ProcessEnv)?,
        })
    }

    fn check(&self, op: &'static str, rc: c_int) -> Result<()> {
        check(rc, op, self.rank)
    }

    fn count(&self, op: &'static str, bytes: usize, dtype: DType) -> Result<c_int> {
        int(op, self.rank, "count", bytes / dtype.size())
    }

    /// Counts and displacements (in elements) as MPI `int`s.
    fn layout(
        &self,
        op: &'static str,
        arg: &'static str,
        counts: &[usize],
    ) -> Result<(Vec<c_int>, Vec<c_int>)> {
        let mut c = Vec::with_capacity(counts.len());
        let mut d = Vec::with_capacity(counts.len());
        let mut off = 0usize;
        for &n in counts {
            c.push(int(op, self.rank, arg, n)?);
            d.push(int(op, self.rank, arg, off)?);
            off += n;
        }
        Ok((c, d))
    }
}

/// Where an empty buffer points instead of the slice's dangling pointer, which can equal the
/// `MPI_IN_PLACE` sentinel (OpenMPI's is address 1, the dangling pointer of an empty `[u8]`). MPI
/// reads or writes nothing through it.
static EMPTY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn at(b: &[u8]) -> *const c_void {
    if b.is_empty() {
        EMPTY.as_ptr() as *const c_void
    } else {
        b.as_ptr() as *const c_void
    }
}

fn at_mut(b: &mut [u8]) -> *mut c_void {
    if b.is_empty() {
        EMPTY.as_ptr() as *mut c_void
    } else {
        b.as_mut_ptr() as *mut c_void
    }
}

impl Engine for MpiEngine {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn node_ids(&self) -> Result<Vec<String>> {
        const W: usize = 256;
        let name = ProcessEnv
            .lookup("KOLO_NODE_ID")
            .filter(|s| !s.is_empty())
            .or_else(|| mpi::environment::processor_name().ok())
            .unwrap_or_else(|| "localhost".into());
        let mut mine = [0u8; W];
        let b = name.as_bytes();
        mine[..b.len().min(W)].copy_from_slice(&b[..b.len().min(W)]);
        let mut all = vec![0u8; W * self.size];
        // SAFETY: W bytes from this rank, W per rank into `all`.
        let rc = unsafe {
            ffi::MPI_Allgather(
                at(&mine),
                W as c_int,
                ffi::RSMPI_UINT8_T,
                at_mut(&mut all),
                W as c_int,
                ffi::RSMPI_UINT8_T,
                self.comm.0,
            )
        };
        self.check("init", rc)?;
        Ok(all
            .chunks_exact(W)
            .map(|c| {
                let end = c.iter().position(|&x| x == 0).unwrap_or(W);
                String::from_utf8_lossy(&c[..end]).into_owned()
            })
            .collect())
    }

    fn agree(
        &self,
        header: &Header,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        self.agree_on_call(header, deadline, interrupted)
    }

    fn barrier(&self) -> Result<()> {
        // SAFETY: valid communicator.
        self.check("barrier", unsafe { ffi::MPI_Barrier(self.comm.0) })
    }

    fn broadcast(&self, buf: &mut [u8], dtype: DType, root: usize) -> Result<()> {
        let n = self.count("broadcast", buf.len(), dtype)?;
        // SAFETY: `buf` holds `n` elements of `dtype`; `root` was checked against the group.
        let rc =
            unsafe { ffi::MPI_Bcast(at_mut(buf), n, datatype(dtype), root as c_int, self.comm.0) };
        self.check("broadcast", rc)
    }

    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        const OP: &str = "all_reduce";
        if self.converts(dtype) {
            let input = buf.to_vec();
            return MpiEngine::through_f32(dtype, &[&input], buf, |ins, out| {
                out.copy_from_slice(&ins[0]);
                self.all_reduce(bytes_of_mut(out), DType::F32, op)
            });
        }
        let n = self.count(OP, buf.len(), dtype)?;
        // SAFETY: `buf` holds `n` elements of `dtype`, reduced in place.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                in_place(),
                at_mut(buf),
                n,
                datatype(dtype),
                operator(dtype, op),
                self.comm.0,
            )
        };
        self.check(OP, rc)?;
        Reducer::new(dtype, op).finish(buf, self.size);
        Ok(())
    }

    fn reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        const OP: &str = "reduce";
        if self.converts(dtype) {
            let input = buf.to_vec();
            let mut out = buf.to_vec();
            MpiEngine::through_f32(dtype, &[&input], &mut out, |ins, o| {
                o.copy_from_slice(&ins[0]);
                self.reduce(bytes_of_mut(o), DType::F32, op, root)
            })?;
            if self.rank == root {
                buf.copy_from_slice(&out);
            }
            return Ok(());
        }
        let n = self.count(OP, buf.len(), dtype)?;
        let ptr = at_mut(buf);
        let (send, recv) = if self.rank == root {
            (in_place() as *const c_void, ptr)
        } else {
            (ptr as *const c_void, std::ptr::null_mut())
        };
        // SAFETY: `buf` holds `n` elements; only the root's is written (in place).
        let rc = unsafe {
            ffi::MPI_Reduce(
                send,
                recv,
                n,
                datatype(dtype),
                operator(dtype, op),
                root as c_int,
                self.comm.0,
            )
        };
        self.check(OP, rc)?;
        if self.rank == root {
            Reducer::new(dtype, op).finish(buf, self.size);
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce_scatter";
        if self.converts(dtype) {
            return MpiEngine::through_f32(dtype, &[send], recv, |ins, out| {
                self.reduce_scatter(bytes_of(&ins[0]), bytes_of_mut(out), DType::F32, op)
            });
        }
        let n = self.count(OP, recv.len(), dtype)?;
        // SAFETY: `send` holds size × n elements, `recv` n (checked by the communicator).
        let rc = unsafe {
            ffi::MPI_Reduce_scatter_block(
                at(send),
                at_mut(recv),
                n,
                datatype(dtype),
                operator(dtype, op),
                self.comm.0,
            )
        };
        self.check(OP, rc)?;
        Reducer::new(dtype, op).finish(recv, self.size);
        Ok(())
    }

    fn all_gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()> {
        let dt = datatype(dtype);
        let (op, rc) = match counts {
            None => {
                let n = self.count("all_gather", send.len(), dtype)?;
                // SAFETY: `send` holds n elements, `recv` size × n.
                let rc = unsafe {
                    ffi::MPI_Allgather(at(send), n, dt, at_mut(recv), n, dt, self.comm.0)
                };
                ("all_gather", rc)
            }
            Some(counts) => {
                const OP: &str = "all_gather_v";
                let (c, d) = self.layout(OP, "counts", counts)?;
                let n = self.count(OP, send.len(), dtype)?;
                // SAFETY: `send` holds counts[rank] elements, `recv` their sum.
                let rc = unsafe {
                    ffi::MPI_Allgatherv(
                        at(send),
                        n,
                        dt,
                        at_mut(recv),
                        c.as_ptr(),
                        d.as_ptr(),
                        dt,
                        self.comm.0,
                    )
                };
                (OP, rc)
            }
        };
        self.check(op, rc)
    }

    fn gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        let dt = datatype(dtype);
        let (op, rc) = match counts {
            None => {
                let n = self.count("gather", send.len(), dtype)?;
                // SAFETY: `send` holds n elements; on the root `recv` holds size × n.
                let rc = unsafe {
                    ffi::MPI_Gather(
                        at(send),
                        n,
                        dt,
                        at_mut(recv),
                        n,
                        dt,
                        root as c_int,
                        self.comm.0,
                    )
                };
                ("gather", rc)
            }
            Some(counts) => {
                const OP: &str = "gather_v";
                let (c, d) = self.layout(OP, "counts", counts)?;
                let n = self.count(OP, send.len(), dtype)?;
                // SAFETY: `send` holds counts[rank] elements; on the root `recv` holds their sum.
                let rc = unsafe {
                    ffi::MPI_Gatherv(
                        at(send),
                        n,
                        dt,
                        at_mut(recv),
                        c.as_ptr(),
                        d.as_ptr(),
                        dt,
                        root as c_int,
                        self.comm.0,
                    )
                };
                (OP, rc)
            }
        };
        self.check(op, rc)
    }

    fn scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        let dt = datatype(dtype);
        let (op, rc) = match counts {
            None => {
                let n = self.count("scatter", recv.len(), dtype)?;
                // SAFETY: `recv` holds n elements; on the root `send` holds size × n.
                let rc = unsafe {
                    ffi::MPI_Scatter(
                        at(send),
                        n,
                        dt,
                        at_mut(recv),
                        n,
                        dt,
                        root as c_int,
                        self.comm.0,
                    )
                };
                ("scatter", rc)
            }
            Some(counts) => {
                const OP: &str = "scatter_v";
                let (c, d) = self.layout(OP, "counts", counts)?;
                let n = self.count(OP, recv.len(), dtype)?;
                // SAFETY: `recv` holds counts[rank] elements; on the root `send` holds their sum.
                let rc = unsafe {
                    ffi::MPI_Scatterv(
                        at(send),
                        c.as_ptr(),
                        d.as_ptr(),
                        dt,
                        at_mut(recv),
                        n,
                        dt,
                        root as c_int,
                        self.comm.0,
                    )
                };
                (OP, rc)
            }
        };
        self.check(op, rc)
    }

    fn all_to_all(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<(&[usize], &[usize])>,
    ) -> Result<()> {
        let dt = datatype(dtype);
        let (op, rc) = match counts {
            None => {
                let n = self.count("all_to_all", send.len() / self.size.max(1), dtype)?;
                // SAFETY: `send` and `recv` hold size blocks of n elements.
                let rc =
                    unsafe { ffi::MPI_Alltoall(at(send), n, dt, at_mut(recv), n, dt, self.comm.0) };
                ("all_to_all", rc)
            }
            Some((sc, rc_counts)) => {
                const OP: &str = "all_to_all_v";
                let (s, sd) = self.layout(OP, "send_counts", sc)?;
                let (r, rd) = self.layout(OP, "recv_counts", rc_counts)?;
                // SAFETY: `send` holds sum(send_counts) elements, `recv` sum(recv_counts).
                let rc = unsafe {
                    ffi::MPI_Alltoallv(
                        at(send),
                        s.as_ptr(),
                        sd.as_ptr(),
                        dt,
                        at_mut(recv),
                        r.as_ptr(),
                        rd.as_ptr(),
                        dt,
                        self.comm.0,
                    )
                };
                (OP, rc)
            }
        };
        self.check(op, rc)
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Arc<dyn Engine>>> {
        const OP: &str = "split";
        let color = match color {
            // SAFETY: reading a constant rsmpi exports.
            None => unsafe { ffi::RSMPI_UNDEFINED },
            Some(c) => int(OP, self.rank, "color", c as usize)?,
        };
        let key = c_int::try_from(key).map_err(|_| Error::InvalidArgument {
            op: OP,
            rank: self.rank,
            arg: "key",
            reason: format!("{key} is outside MPI's int range"),
        })?;
        // SAFETY: a null handle is only an out-parameter placeholder.
        let mut out: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: valid communicator; `out` is written by MPI.
        let rc = unsafe { ffi::MPI_Comm_split(self.comm.0, color, key, &mut out) };
        self.check(OP, rc)?;
        // SAFETY: reading a constant rsmpi exports.
        if out == unsafe { ffi::RSMPI_COMM_NULL } {
            return Ok(None);
        }
        let comm = Comm(out);
        // SAFETY: `out` is the communicator just made.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(out, ffi::RSMPI_ERRORS_RETURN) };
        self.check(OP, rc)?;
        Ok(Some(Arc::new(MpiEngine::over(comm, self.watch.clone())?)))
    }
}
