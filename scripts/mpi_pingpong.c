/* OpenMPI peer for `kolo bench p2p`: ping-pong between ranks 0 and 1 (MPI_Send/MPI_Recv of bytes),
 * timed as kolo bench times it: warm-up, a barrier, then `iters` round trips; time is half a round
 * trip. Prints one JSON object per message size on rank 0, with the fields of the other peers:
 *   {"impl":"openmpi","op":"p2p","n":N,"bytes":B,"time_us":T,"algbw_gbps":A,"busbw_gbps":A,"wrong":W}
 * Usage: mpirun -n 2 ./mpi_pingpong [bytes ...]   (default sizes: 4 B .. 64 MiB) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static void bench(size_t bytes, int rank, int n) {
    unsigned char *a = malloc(bytes ? bytes : 1);
    for (size_t i = 0; i < bytes; i++) a[i] = (unsigned char)(i % 7 + rank);
    /* kolo bench's counts (scripts/compare_peers.py --op p2p gives it --iters 100000 below 64 KiB) */
    int iters = bytes < (64 << 10) ? 100000 : bytes < (1 << 20) ? 1000 : (bytes < (16 << 20) ? 50 : 10);
    int peer = 1 - rank;
    for (int i = -5; i < iters; i++) {
        if (i == 0) MPI_Barrier(MPI_COMM_WORLD);
        static double t;
        if (i == 0) t = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(a, (int)bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(a, (int)bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(a, (int)bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(a, (int)bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
        if (i == iters - 1 && rank == 0) {
            double dt = (MPI_Wtime() - t) / iters / 2;
            int wrong = 0;
            for (size_t j = 0; j < bytes; j++) wrong += a[j] != (unsigned char)(j % 7);
            double alg = (double)bytes / dt / 1e9;
            printf("{\"impl\":\"openmpi\",\"op\":\"p2p\",\"n\":%d,\"bytes\":%zu,\"time_us\":%.3f,"
                   "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"wrong\":%d}\n",
                   n, bytes, dt * 1e6, alg, alg, wrong);
            fflush(stdout);
        }
    }
    free(a);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        if (rank == 0) fprintf(stderr, "mpi_pingpong needs 2 ranks\n");
        MPI_Finalize();
        return 1;
    }
    if (argc > 1) {
        for (int i = 1; i < argc; i++) bench((size_t)strtoull(argv[i], NULL, 10), rank, n);
    } else {
        size_t sizes[] = {4, 1024, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
        for (int s = 0; s < 7; s++) bench(sizes[s], rank, n);
    }
    MPI_Finalize();
    return 0;
}
