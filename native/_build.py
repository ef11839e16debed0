"""cffi API-mode builder for `native._uring`, our bindings to liburing (Debian's liburing-dev 2.3).

Rules this module keeps:
- Built only by `pip install -e .` (setup.py names `ffibuilder` in `cffi_modules`; `make setup` runs
  it). Never by hand: a stale hand-built .so would shadow the installed one.
- API mode, not ABI mode: most of liburing's prep helpers are `static inline` in the header, so
  only a compiled module can call them. The cdef declares structs as partial (`...;`): the C
  compiler supplies their layout, so nothing here depends on liburing's struct sizes.
- The hot path lives in the small `rl_*` helpers below, one C call per SQE: from Python each
  call costs about a microsecond, so a prep is one get-SQE + prep + flags + user_data call.
  Reaping is native/loop.c's (a CPython extension: it builds the Python objects a batch becomes).
- Every helper returns 0 or a negative errno (as liburing does) and accepts a NULL ring (a closed
  `Ring`) by returning -EBADF instead of crashing.
- liburing 2.3 has `io_uring_register_buf_ring` but not `io_uring_setup_buf_ring` (2.4): the
  provided-buffer ring and its buffers are mmapped here, page aligned as the kernel requires.
"""

from __future__ import annotations

from cffi import FFI

CDEF = """
struct io_uring { ...; };
struct __kernel_timespec { long long tv_sec; long long tv_nsec; ...; };

#define IORING_CQE_F_BUFFER ...
#define IORING_CQE_F_MORE ...
#define IORING_CQE_F_SOCK_NONEMPTY ...
#define IORING_CQE_BUFFER_SHIFT ...
#define IORING_SETUP_SUBMIT_ALL ...
#define IORING_SETUP_COOP_TASKRUN ...
#define IORING_SETUP_TASKRUN_FLAG ...
#define IORING_SETUP_SINGLE_ISSUER ...
#define IORING_SETUP_DEFER_TASKRUN ...
#define IORING_SETUP_CQSIZE ...
#define SPLICE_F_MOVE ...
#define SPLICE_F_NONBLOCK ...
#define SPLICE_F_MORE ...

/* A provided-buffer ring and its buffers, both in one mmap owned by this struct. */
struct rl_bufring {
    char *base;          /* buffer `bid` starts at base + bid * size */
    unsigned size;
    unsigned count;
    unsigned mask;
    unsigned bgid;
    ...;
};

/* Size of the memory `rl_prep_sendmsg` needs for n buffers (a msghdr followed by n iovecs). */
size_t rl_msg_bytes(unsigned n);
size_t rl_iov_bytes(unsigned n);

int rl_queue_init(unsigned entries, unsigned cq_entries, unsigned flags, struct io_uring *ring);
void rl_queue_exit(struct io_uring *ring);
unsigned rl_setup_flags(struct io_uring *ring);
unsigned rl_sq_space_left(struct io_uring *ring);
unsigned rl_sq_ready(struct io_uring *ring);
unsigned rl_cq_ready(struct io_uring *ring);
int rl_cq_quiet(struct io_uring *ring);

int rl_submit(struct io_uring *ring);
int rl_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int rl_submit_and_wait_timeout(struct io_uring *ring, unsigned wait_nr, long long sec, long long nsec);

int rl_prep_nop(struct io_uring *ring, uint64_t ud, int link);
int rl_prep_accept(struct io_uring *ring, int fd, int multishot, int sock_flags, uint64_t ud, int link);
int rl_prep_recv(struct io_uring *ring, int fd, void *buf, size_t len, uint64_t ud, int link);
int rl_prep_recv_multishot(struct io_uring *ring, int fd, unsigned bgid, uint64_t ud, int link);
int rl_prep_send(struct io_uring *ring, int fd, void *buf, size_t len, uint64_t ud, int link);
int rl_prep_sendmsg(struct io_uring *ring, int fd, void *mem, void *bases[], size_t lens[],
                    unsigned n, uint64_t ud, int link);
int rl_prep_writev(struct io_uring *ring, int fd, void *mem, void *bases[], size_t lens[],
                   unsigned n, int64_t offset, uint64_t ud, int link);
int rl_prep_read(struct io_uring *ring, int fd, void *buf, size_t len, int64_t offset, uint64_t ud,
                 int link);
int rl_prep_fsync(struct io_uring *ring, int fd, int datasync, uint64_t ud, int link);
int rl_prep_splice(struct io_uring *ring, int fd_in, int64_t off_in, int fd_out, int64_t off_out,
                   unsigned nbytes, unsigned splice_flags, uint64_t ud, int link);
int rl_prep_timeout(struct io_uring *ring, struct __kernel_timespec *ts, long long sec,
                    long long nsec, uint64_t ud, int link);
int rl_prep_link_timeout(struct io_uring *ring, struct __kernel_timespec *ts, long long sec,
                         long long nsec, uint64_t ud);
int rl_prep_cancel(struct io_uring *ring, uint64_t target, uint64_t ud, int link);
int rl_prep_cancel_all(struct io_uring *ring, uint64_t ud);
int rl_prep_poll_add(struct io_uring *ring, int fd, unsigned poll_mask, uint64_t ud, int link);
int rl_prep_close(struct io_uring *ring, int fd, uint64_t ud, int link);
size_t rl_sockaddr_bytes(void);
int rl_prep_connect(struct io_uring *ring, int fd, void *mem, int family, const unsigned char *addr,
                    unsigned port, unsigned flowinfo, unsigned scope_id, uint64_t ud, int link);

struct rl_bufring *rl_bufring_new(struct io_uring *ring, unsigned bgid, unsigned count,
                                  unsigned size, int *err);
void rl_bufring_give(struct rl_bufring *b, unsigned bid);
int rl_bufring_free(struct io_uring *ring, struct rl_bufring *b);

/* A read-only shared mapping of the first `length` bytes of file `fd`, or NULL (-errno in *err). */
void *rl_map_file(int fd, size_t length, int *err);
void rl_unmap(void *addr, size_t length);
/* 1 when every page of [addr, addr + length) is in memory (mincore), 0 when one is not, -errno. */
int rl_resident(const void *addr, size_t length);
/* vmsplice(2) of [addr, addr + length) into pipe `fd` (pages referenced, not copied): bytes, or -errno. */
long long rl_vmsplice(int fd, const void *addr, size_t length, unsigned flags);
/* splice(2) of up to `length` bytes from pipe `pipe_fd` to socket `sock_fd` without waiting: the
   socket is O_NONBLOCK for the call only (SPLICE_F_NONBLOCK does not stop a blocking socket from
   waiting for room). Bytes moved, 0 when the socket is full, or -errno. */
long long rl_splice_to_socket(int pipe_fd, int sock_fd, size_t length);
/* fdatasync(fd) while a thread of this CPU polls: 0 or -errno (see the source). */
int rl_fdatasync_polled(int fd);
"""

SOURCE = r"""
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* splice, vmsplice */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/syscall.h>

struct rl_bufring {
    char *base;
    unsigned size;
    unsigned count;
    unsigned mask;
    unsigned bgid;
    struct io_uring_buf_ring *br;
    size_t ring_bytes;   /* page-rounded size of the ring entries; the buffers follow them */
    size_t map_bytes;
};

size_t rl_msg_bytes(unsigned n) { return sizeof(struct msghdr) + (size_t)n * sizeof(struct iovec); }
size_t rl_iov_bytes(unsigned n) { return (size_t)n * sizeof(struct iovec); }

int rl_queue_init(unsigned entries, unsigned cq_entries, unsigned flags, struct io_uring *ring)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = flags;
    if (cq_entries) {
        p.flags |= IORING_SETUP_CQSIZE;
        p.cq_entries = cq_entries;
    }
    return io_uring_queue_init_params(entries, ring, &p);
}

void rl_queue_exit(struct io_uring *ring) { io_uring_queue_exit(ring); }
unsigned rl_setup_flags(struct io_uring *ring) { return ring->flags; }
unsigned rl_sq_space_left(struct io_uring *ring) { return io_uring_sq_space_left(ring); }
unsigned rl_sq_ready(struct io_uring *ring) { return io_uring_sq_ready(ring); }
unsigned rl_cq_ready(struct io_uring *ring) { return io_uring_cq_ready(ring); }

/* 1 when no completion waits to be reaped: none in the CQ, none in its overflow list, and no
   task work (with COOP_TASKRUN a socket's readiness is task work until the next enter). */
int rl_cq_quiet(struct io_uring *ring)
{
    if (!ring) return 1;
    if (io_uring_cq_ready(ring)) return 0;
    return !(IO_URING_READ_ONCE(*ring->sq.kflags) & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW));
}

int rl_submit(struct io_uring *ring)
{
    if (!ring) return -EBADF;
    return io_uring_submit(ring);
}

int rl_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
    if (!ring) return -EBADF;
    return io_uring_submit_and_wait(ring, wait_nr);
}

int rl_submit_and_wait_timeout(struct io_uring *ring, unsigned wait_nr, long long sec, long long nsec)
{
    struct __kernel_timespec ts;
    struct io_uring_cqe *cqe = NULL;
    if (!ring) return -EBADF;
    ts.tv_sec = sec;
    ts.tv_nsec = nsec;
    return io_uring_submit_and_wait_timeout(ring, &cqe, wait_nr, &ts, NULL);
}

/* An SQE, submitting first when the SQ is full so callers never see "no SQE". A linked SQE needs
   room for itself and the SQE it links to (usually a link timeout): submitting between the two
   would end the chain early, so it submits first when fewer than two slots are free. */
static inline struct io_uring_sqe *rl_sqe(struct io_uring *ring, int link, int *err)
{
    struct io_uring_sqe *sqe;
    *err = 0;
    if (!ring) { *err = -EBADF; return NULL; }
    if (link && io_uring_sq_space_left(ring) < 2) {
        int r = io_uring_submit(ring);
        if (r < 0) { *err = r; return NULL; }
    }
    sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        int r = io_uring_submit(ring);
        if (r < 0) { *err = r; return NULL; }
        sqe = io_uring_get_sqe(ring);
        if (!sqe) { *err = -EBUSY; return NULL; }
    }
    return sqe;
}

#define RL_FINISH(sqe, ud, link) do { \
    io_uring_sqe_set_data64((sqe), (ud)); \
    if (link) (sqe)->flags |= IOSQE_IO_LINK; \
} while (0)

#define RL_GET(ring, link) \
    int err; \
    struct io_uring_sqe *sqe = rl_sqe((ring), (link), &err); \
    if (!sqe) return err;

int rl_prep_nop(struct io_uring *ring, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_nop(sqe);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_accept(struct io_uring *ring, int fd, int multishot, int sock_flags, uint64_t ud, int link)
{
    RL_GET(ring, link);
    if (multishot)
        io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, sock_flags);
    else
        io_uring_prep_accept(sqe, fd, NULL, NULL, sock_flags);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_recv(struct io_uring *ring, int fd, void *buf, size_t len, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_recv(sqe, fd, buf, len, 0);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_recv_multishot(struct io_uring *ring, int fd, unsigned bgid, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = (__u16)bgid;
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_send(struct io_uring *ring, int fd, void *buf, size_t len, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
    RL_FINISH(sqe, ud, link);
    return 0;
}

static void rl_fill_iov(struct iovec *iov, void *bases[], size_t lens[], unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        iov[i].iov_base = bases[i];
        iov[i].iov_len = lens[i];
    }
}

int rl_prep_sendmsg(struct io_uring *ring, int fd, void *mem, void *bases[], size_t lens[],
                    unsigned n, uint64_t ud, int link)
{
    RL_GET(ring, link);
    struct msghdr *msg = (struct msghdr *)mem;
    struct iovec *iov = (struct iovec *)((char *)mem + sizeof(struct msghdr));
    memset(msg, 0, sizeof(*msg));
    rl_fill_iov(iov, bases, lens, n);
    msg->msg_iov = iov;
    msg->msg_iovlen = n;
    io_uring_prep_sendmsg(sqe, fd, msg, MSG_NOSIGNAL);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_writev(struct io_uring *ring, int fd, void *mem, void *bases[], size_t lens[],
                   unsigned n, int64_t offset, uint64_t ud, int link)
{
    RL_GET(ring, link);
    struct iovec *iov = (struct iovec *)mem;
    rl_fill_iov(iov, bases, lens, n);
    io_uring_prep_writev(sqe, fd, iov, n, (__u64)offset);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_read(struct io_uring *ring, int fd, void *buf, size_t len, int64_t offset, uint64_t ud,
                 int link)
{
    RL_GET(ring, link);
    io_uring_prep_read(sqe, fd, buf, (unsigned)len, (__u64)offset);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_fsync(struct io_uring *ring, int fd, int datasync, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_fsync(sqe, fd, datasync ? IORING_FSYNC_DATASYNC : 0);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_splice(struct io_uring *ring, int fd_in, int64_t off_in, int fd_out, int64_t off_out,
                   unsigned nbytes, unsigned splice_flags, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_splice(sqe, fd_in, off_in, fd_out, off_out, nbytes, splice_flags);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_timeout(struct io_uring *ring, struct __kernel_timespec *ts, long long sec,
                    long long nsec, uint64_t ud, int link)
{
    RL_GET(ring, link);
    ts->tv_sec = sec;
    ts->tv_nsec = nsec;
    io_uring_prep_timeout(sqe, ts, 0, 0);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_link_timeout(struct io_uring *ring, struct __kernel_timespec *ts, long long sec,
                         long long nsec, uint64_t ud)
{
    RL_GET(ring, 0);
    ts->tv_sec = sec;
    ts->tv_nsec = nsec;
    io_uring_prep_link_timeout(sqe, ts, 0);
    RL_FINISH(sqe, ud, 0);
    return 0;
}

int rl_prep_poll_add(struct io_uring *ring, int fd, unsigned poll_mask, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_poll_add(sqe, fd, poll_mask);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_cancel(struct io_uring *ring, uint64_t target, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_cancel64(sqe, target, 0);
    RL_FINISH(sqe, ud, link);
    return 0;
}

int rl_prep_cancel_all(struct io_uring *ring, uint64_t ud)
{
    RL_GET(ring, 0);
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ALL | IORING_ASYNC_CANCEL_ANY);
    RL_FINISH(sqe, ud, 0);
    return 0;
}

int rl_prep_close(struct io_uring *ring, int fd, uint64_t ud, int link)
{
    RL_GET(ring, link);
    io_uring_prep_close(sqe, fd);
    RL_FINISH(sqe, ud, link);
    return 0;
}

/* connect(2) to an IPv4 (addr: 4 bytes) or IPv6 (16 bytes) address: the sockaddr is written into
   `mem` (rl_sockaddr_bytes() long, the caller's, kept until the final CQE), so its layout is the C
   compiler's, not ours. -EAFNOSUPPORT for another family. */
size_t rl_sockaddr_bytes(void) { return sizeof(struct sockaddr_storage); }

int rl_prep_connect(struct io_uring *ring, int fd, void *mem, int family, const unsigned char *addr,
                    unsigned port, unsigned flowinfo, unsigned scope_id, uint64_t ud, int link)
{
    socklen_t len;
    memset(mem, 0, sizeof(struct sockaddr_storage));
    if (family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)mem;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        memcpy(&sin->sin_addr, addr, 4);
        len = sizeof(*sin);
    } else if (family == AF_INET6) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)mem;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        sin6->sin6_flowinfo = htonl(flowinfo);
        memcpy(&sin6->sin6_addr, addr, 16);
        sin6->sin6_scope_id = scope_id;
        len = sizeof(*sin6);
    } else {
        return -EAFNOSUPPORT;
    }
    RL_GET(ring, link);
    io_uring_prep_connect(sqe, fd, (struct sockaddr *)mem, len);
    RL_FINISH(sqe, ud, link);
    return 0;
}

struct rl_bufring *rl_bufring_new(struct io_uring *ring, unsigned bgid, unsigned count,
                                  unsigned size, int *err)
{
    struct rl_bufring *b;
    struct io_uring_buf_reg reg;
    long page = sysconf(_SC_PAGESIZE);
    size_t ring_bytes, map_bytes;
    void *mem;
    int r;

    *err = 0;
    if (!ring) { *err = -EBADF; return NULL; }
    if (count == 0 || (count & (count - 1)) || count > 32768 || size == 0) { *err = -EINVAL; return NULL; }
    ring_bytes = ((size_t)count * sizeof(struct io_uring_buf) + page - 1) & ~((size_t)page - 1);
    map_bytes = ring_bytes + (size_t)count * size;
    b = calloc(1, sizeof(*b));
    if (!b) { *err = -ENOMEM; return NULL; }
    mem = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (mem == MAP_FAILED) { *err = -errno; free(b); return NULL; }
    b->br = (struct io_uring_buf_ring *)mem;
    b->base = (char *)mem + ring_bytes;
    b->size = size;
    b->count = count;
    b->mask = (unsigned)io_uring_buf_ring_mask(count);
    b->bgid = bgid;
    b->ring_bytes = ring_bytes;
    b->map_bytes = map_bytes;
    io_uring_buf_ring_init(b->br);
    memset(&reg, 0, sizeof(reg));
    reg.ring_addr = (unsigned long)(uintptr_t)b->br;
    reg.ring_entries = count;
    reg.bgid = (__u16)bgid;
    r = io_uring_register_buf_ring(ring, &reg, 0);
    if (r) { *err = r; munmap(mem, map_bytes); free(b); return NULL; }
    for (unsigned i = 0; i < count; i++)
        io_uring_buf_ring_add(b->br, b->base + (size_t)i * size, size, (unsigned short)i,
                              (int)b->mask, (int)i);
    io_uring_buf_ring_advance(b->br, (int)count);
    return b;
}

void rl_bufring_give(struct rl_bufring *b, unsigned bid)
{
    io_uring_buf_ring_add(b->br, b->base + (size_t)bid * b->size, b->size, (unsigned short)bid,
                          (int)b->mask, 0);
    io_uring_buf_ring_advance(b->br, 1);
}

int rl_bufring_free(struct io_uring *ring, struct rl_bufring *b)
{
    int r = 0;
    if (ring) r = io_uring_unregister_buf_ring(ring, (int)b->bgid);
    munmap(b->br, b->map_bytes);
    free(b);
    return r;
}

void *rl_map_file(int fd, size_t length, int *err)
{
    void *p = mmap(NULL, length, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { *err = -errno; return NULL; }
    *err = 0;
    return p;
}

void rl_unmap(void *addr, size_t length) { munmap(addr, length); }

long long rl_vmsplice(int fd, const void *addr, size_t length, unsigned flags)
{
    struct iovec iov = { (void *)addr, length };
    ssize_t n = vmsplice(fd, &iov, 1, flags);
    return n < 0 ? -errno : n;
}

long long rl_splice_to_socket(int pipe_fd, int sock_fd, size_t length)
{
    int fl = fcntl(sock_fd, F_GETFL);
    if (fl < 0) return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(sock_fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    ssize_t n = splice(pipe_fd, NULL, sock_fd, NULL, length, SPLICE_F_NONBLOCK);
    int err = errno;
    if (!(fl & O_NONBLOCK)) fcntl(sock_fd, F_SETFL, fl);
    if (n >= 0) return n;
    return err == EAGAIN ? 0 : -err;
}

/* A blocking fdatasync leaves its CPU idle, and on a VM an idle vCPU halts: the disk's completion
   then has to wake it through the host (~100 us on the 2-vCPU VM the benches run on, where the guest's
   own halt polling is off). The poller, a thread started by the first call (inheriting the
   caller's CPU and, meanwhile, a mask blocking every signal, so signals still go to the loop's
   thread), keeps the CPU busy for the length of each call: it yields at every turn, so whatever
   else wants the CPU (the journal thread, the woken caller) gets it at once; between calls it
   sleeps on a futex. A thread that cannot be started leaves a plain fdatasync. One per process:
   only the loop's thread calls this. */
static int rl_poll_state;   /* 1 while a call waits in fdatasync */
static int rl_poller_state; /* 0 not started, 1 running, -1 could not start */

static void *rl_poller(void *arg)
{
    (void)arg;
    for (;;) {
        while (__atomic_load_n(&rl_poll_state, __ATOMIC_ACQUIRE) == 0)
            syscall(SYS_futex, &rl_poll_state, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
        while (__atomic_load_n(&rl_poll_state, __ATOMIC_ACQUIRE) == 1)
            sched_yield();
    }
    return NULL;
}

static int rl_poller_start(void)
{
    sigset_t all, old;
    pthread_attr_t attr;
    pthread_t thread;
    int rc;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    rc = pthread_create(&thread, &attr, rl_poller, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0) pthread_setname_np(thread, "rl-sync-poll");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == 0 ? 1 : -1;
}

int rl_fdatasync_polled(int fd)
{
    int rc, err;
    if (rl_poller_state == 0) rl_poller_state = rl_poller_start();
    if (rl_poller_state == 1) {
        __atomic_store_n(&rl_poll_state, 1, __ATOMIC_RELEASE);
        syscall(SYS_futex, &rl_poll_state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
    rc = fdatasync(fd);
    err = errno;
    __atomic_store_n(&rl_poll_state, 0, __ATOMIC_RELEASE);
    return rc < 0 ? -err : 0;
}

int rl_resident(const void *addr, size_t length)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
    uintptr_t end = (uintptr_t)addr + length;
    unsigned char vec[256];
    while (start < end) {
        size_t pages = (end - start + (size_t)page - 1) / (size_t)page;
        if (pages > sizeof(vec)) pages = sizeof(vec);
        if (mincore((void *)start, pages * (size_t)page, vec)) return -errno;
        for (size_t i = 0; i < pages; i++)
            if (!(vec[i] & 1)) return 0;
        start += pages * (size_t)page;
    }
    return 1;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "native._uring",
    SOURCE,
    libraries=["uring"],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
)
