/* Raw MPI_Allreduce in place (MPI_IN_PLACE), printed like the OpenMPI peer harness
 * (../shared/peers/mpi_allreduce.c), which reduces out of place and reports rank 0's time. kolo's
 * all_reduce is in place and `kolo bench` reports the slowest rank's time, so this harness does both:
 * the like-for-like baseline for the overhead of kolo's layer over MPI.
 * Build and run: mpicc -O2 scripts/mpi_allreduce_inplace.c -o /tmp/inplace && mpirun -n 2 /tmp/inplace [bytes ...] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static void bench(size_t bytes, int rank, int n) {
    size_t count = bytes / 4 ? bytes / 4 : 1;
    float *a = malloc(count * 4);
    int iters = bytes < (1 << 20) ? 1000 : (bytes < (16 << 20) ? 50 : 10);
    for (size_t i = 0; i < count; i++) a[i] = (float)(i % 7);
    for (int w = 0; w < 5; w++) MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    /* Check once on fresh data (the timed loop keeps multiplying the values). */
    for (size_t i = 0; i < count; i++) a[i] = (float)(i % 7);
    MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int wrong = 0;
    for (size_t i = 0; i < count; i++) if (a[i] != (float)(i % 7) * n) { wrong++; }
    if (rank == 0) {
        double alg = (double)(count * 4) / dt / 1e9;
        printf("{\"impl\":\"openmpi-inplace\",\"op\":\"allreduce\",\"n\":%d,\"bytes\":%zu,\"time_us\":%.3f,"
               "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"wrong\":%d}\n",
               n, count * 4, dt * 1e6, alg, alg * 2.0 * (n - 1) / n, wrong);
        fflush(stdout);
    }
    free(a);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int i = 1; i < argc; i++) bench((size_t)strtoull(argv[i], NULL, 10), rank, n);
    MPI_Finalize();
    return 0;
}
