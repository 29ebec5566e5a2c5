/*
 * mpi_tree.c - the summation tree cut at process boundaries (mpi_tree.h).
 */
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_tree.h"
#include "core/bf16.h"
#include "core/error.h"

/* The nodes of process q inside [lo, hi): the first ranges of the
 * top-down walk (mid = lo + (hi - lo) / 2, comm.h) inside [a, b). */
static void walk(fsdp_mpi_cover *cv, int q, int a, int b, int lo, int hi)
{
    if (hi <= a || lo >= b)
        return;
    if (lo >= a && hi <= b) {
        int k = cv->n_nodes[q]++;
        FSDP_ASSERT(k < FSDP_MPI_COVER_MAX);
        cv->node_lo[q * FSDP_MPI_COVER_MAX + k] = lo;
        cv->node_hi[q * FSDP_MPI_COVER_MAX + k] = hi;
        return;
    }
    int mid = lo + (hi - lo) / 2;
    walk(cv, q, a, b, lo, mid);
    walk(cv, q, a, b, mid, hi);
}

fsdp_status fsdp_mpi_cover_init(fsdp_mpi_cover *cv, int n_procs, int n_local)
{
    memset(cv, 0, sizeof *cv);
    size_t n = (size_t)n_procs;
    cv->n_nodes = calloc(n, sizeof *cv->n_nodes);
    cv->node_lo = calloc(n * FSDP_MPI_COVER_MAX, sizeof *cv->node_lo);
    cv->node_hi = calloc(n * FSDP_MPI_COVER_MAX, sizeof *cv->node_hi);
    if (!cv->n_nodes || !cv->node_lo || !cv->node_hi) {
        fsdp_mpi_cover_fini(cv);
        return fsdp_error_set(FSDP_STATUS_OOM,
                              "out of host memory for the summation tree of %d processes",
                              n_procs);
    }
    cv->n_procs = n_procs;
    cv->n_local = n_local;
    int N = n_procs * n_local;
    for (int q = 0; q < n_procs; q++)
        walk(cv, q, q * n_local, (q + 1) * n_local, 0, N);
    /* An evaluation of (lo, hi) uses one scratch vector per level below it:
     * the right half, the larger, has hi - mid = ceil(n / 2) ranks. */
    cv->depth = 1;
    for (int span = N; span > 1; span = span - span / 2)
        cv->depth++;
    return FSDP_STATUS_OK;
}

void fsdp_mpi_cover_fini(fsdp_mpi_cover *cv)
{
    free(cv->n_nodes);
    free(cv->node_lo);
    free(cv->node_hi);
    memset(cv, 0, sizeof *cv);
}

size_t fsdp_mpi_node_width(const fsdp_mpi_cover *cv, int q, int k, fsdp_dtype dt)
{
    int i = q * FSDP_MPI_COVER_MAX + k;
    return cv->node_hi[i] - cv->node_lo[i] == 1 ? fsdp_dtype_size(dt) : sizeof(float);
}

size_t fsdp_mpi_node_off(const fsdp_mpi_cover *cv, int q, int k, fsdp_dtype dt, size_t len)
{
    size_t off = 0;
    for (int i = 0; i < k; i++)
        off += (fsdp_mpi_node_width(cv, q, i, dt) * len + 15) & ~(size_t)15;
    return off;
}

/* The payload of process q's node [lo, hi) for this block, as fp32. */
static const float *payload(const fsdp_mpi_tree_job *j, int q, int lo, int hi, float *dst)
{
    const fsdp_mpi_cover *cv = j->cv;
    const int *nlo = cv->node_lo + q * FSDP_MPI_COVER_MAX;
    int k = 0;
    while (k < cv->n_nodes[q] && nlo[k] != lo)
        k++;
    FSDP_ASSERT(k < cv->n_nodes[q] && cv->node_hi[q * FSDP_MPI_COVER_MAX + k] == hi);
    size_t w = fsdp_mpi_node_width(cv, q, k, j->dt);
    const unsigned char *p = j->remote[q] + fsdp_mpi_node_off(cv, q, k, j->dt, j->len) + j->off * w;
    if (w == sizeof(float))
        return (const float *)p;
    const fsdp_bf16 *x = (const fsdp_bf16 *)p;
    for (size_t i = 0; i < j->n; i++)
        dst[i] = fsdp_bf16_to_f32(x[i]);
    return dst;
}

const float *fsdp_mpi_tree_eval(const fsdp_mpi_tree_job *j, int lo, int hi, float *dst,
                                float *const *tmp)
{
    int L = j->cv->n_local, q = lo / L;
    if (q == (hi - 1) / L && q != j->me)
        return payload(j, q, lo, hi, dst);
    if (hi - lo == 1) {
        const void *x = j->leaf[lo - j->me * L];
        if (j->dt == FSDP_DTYPE_F32)
            return (const float *)x + j->off;
        const fsdp_bf16 *b = (const fsdp_bf16 *)x + j->off;
        for (size_t i = 0; i < j->n; i++)
            dst[i] = fsdp_bf16_to_f32(b[i]);
        return dst;
    }
    int mid = lo + (hi - lo) / 2;
    const float *a = fsdp_mpi_tree_eval(j, lo, mid, dst, tmp + 1);
    const float *b = fsdp_mpi_tree_eval(j, mid, hi, tmp[0], tmp + 1);
    for (size_t i = 0; i < j->n; i++)
        dst[i] = a[i] + b[i];
    return dst;
}
