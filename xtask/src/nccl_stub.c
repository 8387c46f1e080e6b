/* A one-rank NCCL for machines without one (`cargo xtask nccl-stub` builds it as
 * target/nccl-stub/libnccl.so.2). It implements the calls tl-tape-cuda's `nccl` module loads,
 * with nccl.h's signatures, for a communicator of one rank: an all-reduce or a broadcast over
 * one rank copies the send buffer into the receive buffer when they differ. A communicator of
 * several ranks is refused (ncclInvalidUsage, with a message saying why), so multi-rank use
 * without the real library is a clear error. The buffers are host memory under the kernel
 * emulator (tl-tape-cuda feature cuda-emu), where the copies really run. With the variable
 * TL_NCCL_STUB_HANG=k set when a communicator is made, its collectives after the first k never
 * finish (a lost rank: the timeout's tests). Never put it where a real NCCL is wanted. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
/* `hang`: TL_NCCL_STUB_HANG=k was set when the communicator was made, so its first k
 * collectives finish and the others never do (ncclCommGetAsyncError says ncclInProgress until
 * ncclCommAbort): a rank lost after k collectives, for the tests of the collectives' timeout.
 * -1 without the variable. `done`: the collectives finished so far. */
typedef struct stubComm { int nranks; long hang; long done; int running; } *ncclComm_t;

enum {
    ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
    ncclInProgress = 7
};

/* What the stub's unique ids hold, so a token that did not come from it is refused. */
static const char MAGIC[] = "tl-nccl-stub one rank";

int ncclGetVersion(int *version) {
    if (version == NULL) return ncclInvalidArgument;
    *version = 0; /* reported as 0.0.0: not a real NCCL */
    return ncclSuccess;
}

int ncclGetUniqueId(ncclUniqueId *id) {
    if (id == NULL) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, MAGIC, sizeof MAGIC);
    return ncclSuccess;
}

int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (comm == NULL) return ncclInvalidArgument;
    if (nranks != 1) return ncclInvalidUsage;
    if (rank != 0 || memcmp(id.internal, MAGIC, sizeof MAGIC) != 0) return ncclInvalidArgument;
    *comm = malloc(sizeof **comm);
    if (*comm == NULL) return ncclSystemError;
    (*comm)->nranks = 1;
    const char *hang = getenv("TL_NCCL_STUB_HANG");
    (*comm)->hang = hang == NULL ? -1 : strtol(hang, NULL, 10);
    (*comm)->done = 0;
    (*comm)->running = 0;
    return ncclSuccess;
}

/* Bytes of one value of ncclDataType_t `t` (0 for an unknown type). */
static size_t type_size(int t) {
    switch (t) {
    case 0: case 1: return 1;          /* ncclInt8, ncclUint8 */
    case 2: case 3: case 7: return 4;  /* ncclInt32, ncclUint32, ncclFloat32 */
    case 4: case 5: case 8: return 8;  /* ncclInt64, ncclUint64, ncclFloat64 */
    case 6: case 9: return 2;          /* ncclFloat16, ncclBfloat16 */
    default: return 0;
    }
}

/* One rank's collective: the receive buffer gets the send buffer. */
static int one_rank(const void *send, void *recv, size_t count, int type, ncclComm_t comm) {
    size_t size = type_size(type);
    if (comm == NULL || comm->nranks != 1 || size == 0) return ncclInvalidArgument;
    if (count == 0) return ncclSuccess;
    if (send == NULL || recv == NULL || count > SIZE_MAX / size) return ncclInvalidArgument;
    /* Queued behind a hung collective (or hanging itself): enqueued, never finished. */
    if (comm->running || (comm->hang >= 0 && comm->done >= comm->hang)) {
        comm->running = 1; /* enqueued, never finished: the results are never written */
        return ncclSuccess;
    }
    comm->done++;
    if (send != recv) memmove(recv, send, count * size);
    return ncclSuccess;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm,
                  void *stream) {
    (void)stream;
    if (op < 0 || op > 4) return ncclInvalidArgument; /* sum, prod, max, min, avg */
    return one_rank(send, recv, count, type, comm);
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root,
                  ncclComm_t comm, void *stream) {
    (void)stream;
    if (root != 0) return ncclInvalidArgument;
    return one_rank(send, recv, count, type, comm);
}

/* Groups fuse the calls between them; one rank's calls run at once, so they are no-ops. */
int ncclGroupStart(void) { return ncclSuccess; }
int ncclGroupEnd(void) { return ncclSuccess; }

/* ncclInProgress while a collective of a hanging communicator "runs", else no error. */
int ncclCommGetAsyncError(ncclComm_t comm, int *state) {
    if (comm == NULL || state == NULL) return ncclInvalidArgument;
    *state = comm->running ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}

/* Stops whatever runs and frees the communicator (as ncclCommDestroy here). */
int ncclCommAbort(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    free(comm);
    return ncclSuccess;
}

int ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    free(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(int result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (the NCCL stub could not allocate)";
    case ncclInvalidArgument: return "invalid argument (NCCL stub)";
    case ncclInProgress: return "operation in progress (NCCL stub)";
    case ncclInvalidUsage:
        return "invalid usage: this is the one-rank NCCL stub of `cargo xtask nccl-stub`; "
               "more than one rank needs the real libnccl.so.2 (set TL_NCCL_LIBRARY to it)";
    default: return "unknown result code (NCCL stub)";
    }
}
