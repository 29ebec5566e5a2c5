/*
 * mpi_layout.c - where a collective's bytes go between processes
 * (mpi_layout.h), and the inter-process byte formula built on it.
 */
#include <stdlib.h>

#include "comm/mpi_layout.h"

size_t fsdp_mpi_slice_start(size_t numel, int n_ranks, int g)
{
    size_t per = (numel + (size_t)n_ranks - 1) / (size_t)n_ranks, s = per * (size_t)g;
    return s < numel ? s : numel;
}

size_t fsdp_mpi_chunk_len(int kind, size_t numel, int n_ranks, int n_local, int to, int j)
{
    if (kind == FSDP_COLL_REDUCE_SCATTER)
        return numel;
    int g = to * n_local + j;
    return fsdp_mpi_slice_start(numel, n_ranks, g + 1) - fsdp_mpi_slice_start(numel, n_ranks, g);
}

/* Bytes of process q's payload for one chunk of len elements. */

static size_t payload_bytes(const fsdp_mpi_cover *cv, int q, fsdp_dtype dt, size_t len)
{
    return fsdp_mpi_node_off(cv, q, cv->n_nodes[q], dt, len);
}

size_t fsdp_mpi_chunk_off(const fsdp_mpi_cover *cv, int kind, size_t numel, fsdp_dtype dt, int q,
                          int to, int j)
{
    int L = cv->n_local, N = cv->n_procs * L;
    size_t off = 0;
    for (int i = 0; i < j; i++)
        off += payload_bytes(cv, q, dt, fsdp_mpi_chunk_len(kind, numel, N, L, to, i));
    return off;
}

/* Bytes of the all_reduce slices of process q's ranks. */
static size_t slices_bytes(size_t numel, int n_ranks, int q, int n_local, size_t es)
{
    return (fsdp_mpi_slice_start(numel, n_ranks, (q + 1) * n_local) -
            fsdp_mpi_slice_start(numel, n_ranks, q * n_local)) * es;
}

void fsdp_mpi_layout_of(const fsdp_mpi_cover *cv, int me, int kind, size_t numel, fsdp_dtype dt,
                        int root, fsdp_mpi_layout *l)
{
    int P = cv->n_procs, L = cv->n_local, N = P * L;
    size_t es = fsdp_dtype_size(dt), s = 0, r = 0;
    for (int q = 0; q < P; q++)
        l->s_off[q] = l->s_len[q] = l->r_off[q] = l->r_len[q] = l->r2_off[q] = l->r2_len[q] = 0;
    l->s2_off = l->s2_len = 0;
    /* What stays in the process is staged too (all_gather: the local
     * chunks; broadcast: the root's buffer), for one path whatever P is. */
    if (kind == FSDP_COLL_ALL_GATHER)
        s = (size_t)L * numel * es;
    else if (kind == FSDP_COLL_BROADCAST && me == root / L)
        s = numel * es;
    for (int q = 0; q < P; q++) {
        if (q == me)
            continue;
        size_t out = 0, in = 0;
        if (kind == FSDP_COLL_ALL_GATHER) { /* my L chunks to everyone; theirs to me */
            out = in = (size_t)L * numel * es;
        } else if (kind == FSDP_COLL_BROADCAST) {
            out = me == root / L ? numel * es : 0;
            in = q == root / L ? numel * es : 0;
        } else if (fsdp_coll_kind_is_reduction(kind)) {
            /* my payloads for q's chunks; q's for mine */
            l->s_off[q] = s;
            s += out = fsdp_mpi_chunk_off(cv, kind, numel, dt, me, q, L);
            in = fsdp_mpi_chunk_off(cv, kind, numel, dt, q, me, L);
        }
        l->s_len[q] = out;
        l->r_off[q] = r;
        r += l->r_len[q] = in;
    }
    if (kind == FSDP_COLL_ALL_REDUCE) { /* round 2: my finished slices to everyone */
        l->s2_off = s = (s + 63) & ~(size_t)63;
        s += l->s2_len = slices_bytes(numel, N, me, L, es);
        for (int q = 0; q < P; q++) {
            if (q == me)
                continue;
            l->r2_off[q] = r = (r + 63) & ~(size_t)63;
            r += l->r2_len[q] = slices_bytes(numel, N, q, L, es);
        }
    }
    l->send_bytes = s;
    l->recv_bytes = r;
}

fsdp_status fsdp_mpi_layout_alloc(fsdp_mpi_layout *l, int n_procs)
{
    size_t *m = calloc(6 * (size_t)n_procs, sizeof *m);
    if (!m)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory laying out collectives of %d "
                              "processes", n_procs);
    l->s_off = m;
    l->s_len = m + n_procs;
    l->r_off = m + 2 * n_procs;
    l->r_len = m + 3 * n_procs;
    l->r2_off = m + 4 * n_procs;
    l->r2_len = m + 5 * n_procs;
    return FSDP_STATUS_OK;
}

void fsdp_mpi_layout_free(fsdp_mpi_layout *l)
{
    free(l->s_off);
    l->s_off = NULL;
}

void fsdp_mpi_layout_inter_bytes(const fsdp_mpi_layout *l, int n_procs, int me, size_t *sent,
                                 size_t *recv)
{
    *sent = *recv = 0;
    for (int q = 0; q < n_procs; q++) {
        if (q == me)
            continue;
        *sent += l->s_len[q] + l->s2_len;
        *recv += l->r_len[q] + l->r2_len[q];
    }
}

fsdp_status fsdp_comm_mpi_inter_bytes(fsdp_coll_kind kind, size_t numel, fsdp_dtype dt,
                                      int n_processes, int n_local, int process, int root,
                                      size_t *sent, size_t *recv)
{
    *sent = *recv = 0;
    if (n_processes < 1 || n_local < 1 || process < 0 || process >= n_processes ||
        (unsigned)kind >= FSDP_COLL_KIND_COUNT || (unsigned)dt >= FSDP_DTYPE_COUNT ||
        (kind == FSDP_COLL_BROADCAST && (root < 0 || root >= n_processes * n_local)))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "inter-process bytes of %s: process %d of %d, %d rank(s) each, "
                              "root %d: out of range",
                              fsdp_coll_kind_name(kind), process, n_processes, n_local, root);
    fsdp_mpi_cover cv;
    fsdp_mpi_layout l;
    FSDP_TRY(fsdp_mpi_cover_init(&cv, n_processes, n_local));
    fsdp_status st = fsdp_mpi_layout_alloc(&l, n_processes);
    if (st == FSDP_STATUS_OK) {
        fsdp_mpi_layout_of(&cv, process, (int)kind, numel, dt, root, &l);
        fsdp_mpi_layout_inter_bytes(&l, n_processes, process, sent, recv);
        fsdp_mpi_layout_free(&l);
    }
    fsdp_mpi_cover_fini(&cv);
    return st;
}
