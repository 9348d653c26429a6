"""Hello world (mpi4py's helloworld.py with one import changed).

    kolo run -n 4 -- python crates/kolo-py/examples/hello.py
    torchrun --nproc_per_node 4 crates/kolo-py/examples/hello.py
"""
from kolo import MPI

comm = MPI.COMM_WORLD
print(f"Hello world from process {comm.Get_rank()} of {comm.Get_size()}", flush=True)
