/*
 * modelfile_pread.c - the one way a weight file's bytes are read: a pread of
 * an open model file (or one file of several), counted per thread.
 *
 * Below both readers that use it, the flat reader (modelfile_flat.c) and
 * the bnb-4bit one (bnb4.c), so that the flat reader may hand a 4-bit
 * weight to bnb4.c without the two calling each other.
 */
#include "ckpt/modelfile_internal.h"
#include "core/fileio.h"

static _Thread_local uint64_t thread_bytes_read;

uint64_t fsdp_modelfile_thread_bytes_read(void) { return thread_bytes_read; }

fsdp_status fsdp_modelfile_pread(const fsdp_modelfile *mf, int part, void *buf, size_t n,
                                 uint64_t off)
{
    bool parts = mf->n_parts > 0;
    FSDP_ASSERT(!parts || (part >= 0 && part < mf->n_parts));
    FSDP_TRY(fsdp_pread_all(parts ? mf->part_fd[part] : mf->fd, buf, n, off, "model file",
                            parts ? mf->part_path[part] : mf->path));
    thread_bytes_read += n;
    return FSDP_STATUS_OK;
}
