/* pathprobe-delay-line: holds each lab path's packets for the path's one-way delay, for
 * kernels without netem.
 *
 * iptables sends each delayed path's packets to its own NFQUEUE; this process binds every
 * queue on a netlink socket of its own and accepts each packet once it has been held for its
 * queue's delay. Why it is built this way:
 * - compiled, one thread: a packet costs a few microseconds, so the release of one path is
 *   never queued behind the work of another (the Python line it replaces took ~20 us a packet
 *   and 25-35% of a core under the demo, and its service time showed as RTT on idle paths);
 * - a socket per queue, read in turns of at most BATCH messages: a test filling one path's
 *   socket cannot hold the packets of another path behind it;
 * - copy mode META and F_GSO: payloads never come to userspace, GSO super-packets whole;
 * - a batch verdict accepts a queue's due packets together (NF_ACCEPT for every id up to the
 *   last due one), right because a queue's packets are released in order (FIFO); VERDICT_MOST
 *   at a time, the earliest due queue first, so that one path's batch never holds another's;
 * - each hold runs from the kernel's receive timestamp (NFQA_TIMESTAMP), so the wake-up that
 *   reads a packet is not added to its delay;
 * - SCHED_FIFO, 1 ns timer slack and nanosecond epoll timeouts, so that a release is late by
 *   the machine's timer wake-up only, not by the exporters, iperf3 or Prometheus beside it;
 * - a wake-up for a release, not also one for each arrival while a release falls due sooner than
 *   any new packet could (wait_until): a context switch costs a VM's process microseconds;
 * - delays changed while it runs, through its control socket: a restart would make the kernel
 *   drop every packet that every path holds (the queues go with their socket) and let packets
 *   through undelayed until the new process binds, so one path's delay change would cost the
 *   other paths' tests their packets.
 *
 * Usage: pathprobe-delay-line [--control PATH] QUEUE:SECONDS [QUEUE:SECONDS ...]
 * Prints "ready" once every queue is bound. Exits 2 on bad arguments, 1 on a netlink error.
 * With --control it listens on the Unix stream socket PATH for a line "QUEUE:SECONDS ..." (the
 * delays wanted from now on) and answers "ok" or "error: WHY" once they apply (a request is read
 * with the queues: at once when nothing is held, else within LAZY_READ_NS): a queue not bound
 * yet is bound, a listed one takes its new delay for the packets it queues from then on (held
 * ones keep theirs and nothing overtakes them: a queue stays FIFO), one not listed keeps its
 * delay (the lab removes its iptables rule, so nothing more comes to it). A malformed line
 * changes nothing.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <libmnl/libmnl.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64                     /* messages read from one queue's socket per turn */
#define MSG_BYTES 1024               /* one META-mode packet message is ~150 bytes */
#define QUEUE_MAXLEN 65536           /* packets the kernel holds per queue */
#define RCVBUF_BYTES (32 << 20)
#define REALTIME_PRIORITY 10         /* above ordinary processes, below the kernel's RT threads */
#define MAX_CATCH_UP_NS 5000000      /* a larger queued-to-read gap is a clock step */
#define SO_TIMESTAMPNS_OPT 35
#define MAX_WAKE_EARLY_NS 20000      /* the most a wake-up is asked early (and so spun) */
/* A queue whose delay is at least LAZY_DELAY_NS is read every LAZY_READ_NS instead of on
 * each arrival: its packets fall due long after they are read, and waking for each arrival
 * costs a wake-up a packet. Shorter delays wake this process as their packets arrive. */
#define LAZY_DELAY_NS 2000000
#define LAZY_READ_NS 1000000
/* Packets one verdict accepts at most (release_due says why): a GSO packet of a test costs some
 * microseconds to forward, a verdict itself about one. */
#define VERDICT_MOST 8
#define CONTROL_BYTES 65536          /* one control line: ~12 bytes a queue */

struct held {
	uint64_t due_ns;
	uint32_t id;
};

struct path {
	uint16_t queue;
	uint64_t delay_ns;
	struct mnl_socket *nl;
	unsigned int portid;
	struct held *ring; /* FIFO of held packets, a power-of-two ring that grows */
	size_t cap, head, count;
	size_t heap_pos; /* index in the due heap, or SIZE_MAX when nothing is held */
};

/* Counted for the log (printed on SIGUSR1 and SIGTERM): how late releases are is the delay's error,
 * apart for the prompt queues (short delays: the probes of the lab's near paths, whose RTT tail it
 * is) and the lazy ones. */
#define LATE_BUCKETS 101 /* 10 us each; the last one is 1 ms and more */
enum { PROMPT, LAZY };
static struct {
	uint64_t packets, reads, wakeups, verdicts;
	uint64_t late[2][LATE_BUCKETS];
} stats;
static volatile sig_atomic_t report_asked, stop_asked;
static sigset_t waiting_mask; /* the signal mask while waiting for packets: see main */

static struct path **paths; /* each allocated once: the epoll sets and the heap point to them */
static size_t npaths, paths_cap;
static struct path **heap; /* paths holding packets, the earliest head due first */
static size_t heap_len;
static int ep_all, ep_prompt; /* every queue's socket and the control socket; the prompt queues' */
static const char *control_path; /* --control */
static int control_fd = -1;       /* in ep_all with a NULL data.ptr */
/* The shortest delay of a prompt queue (UINT64_MAX: none): a packet read from now on falls due no
 * sooner than this after the last read began, so a release due within it need not wake for arrivals. */
static uint64_t shortest_prompt_ns = UINT64_MAX;

static int bind_queue(struct path *p);
static void raise_fd_limit(void);
static void on_control(void);

static void die(const char *what)
{
	fprintf(stderr, "delay line: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The monotonic and the real-time clock now, the real one read first: a pause between the two reads
 * (an interrupt, a VM's stolen time: tens of microseconds, now and then) then makes a hold count
 * from a later monotonic time and end late by it, never early (in the other order it ended early). */
static void clock_pair(uint64_t *mono, uint64_t *real)
{
	*real = clock_ns(CLOCK_REALTIME);
	*mono = clock_ns(CLOCK_MONOTONIC);
}

static uint64_t head_due(const struct path *p)
{
	return p->ring[p->head].due_ns;
}

/* Whether a queue's socket wakes this process on each arrival (see LAZY_DELAY_NS). */
static bool prompt(const struct path *p)
{
	return p->delay_ns < LAZY_DELAY_NS;
}

static void heap_swap(size_t a, size_t b)
{
	struct path *t = heap[a];
	heap[a] = heap[b];
	heap[b] = t;
	heap[a]->heap_pos = a;
	heap[b]->heap_pos = b;
}

static void heap_up(size_t i)
{
	while (i > 0 && head_due(heap[(i - 1) / 2]) > head_due(heap[i])) {
		heap_swap(i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static void heap_down(size_t i)
{
	for (;;) {
		size_t least = i, l = 2 * i + 1, r = l + 1;
		if (l < heap_len && head_due(heap[l]) < head_due(heap[least]))
			least = l;
		if (r < heap_len && head_due(heap[r]) < head_due(heap[least]))
			least = r;
		if (least == i)
			return;
		heap_swap(i, least);
		i = least;
	}
}

static void hold(struct path *p, uint64_t due_ns, uint32_t id)
{
	if (p->count == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 1024;
		struct held *ring = malloc(cap * sizeof(*ring));
		if (!ring)
			die("out of memory");
		for (size_t k = 0; k < p->count; k++)
			ring[k] = p->ring[(p->head + k) & (p->cap - 1)];
		free(p->ring);
		p->ring = ring;
		p->cap = cap;
		p->head = 0;
	}
	p->ring[(p->head + p->count) & (p->cap - 1)] = (struct held){due_ns, id};
	if (p->count++ == 0) {
		p->heap_pos = heap_len;
		heap[heap_len++] = p;
		heap_up(p->heap_pos);
	}
}

static void on_packet(struct path *p, const struct nlmsghdr *nlh, uint64_t now_mono, uint64_t now_real)
{
	struct nlattr *attr[NFQA_MAX + 1] = {0};
	if (nfq_nlmsg_parse(nlh, attr) < 0 || !attr[NFQA_PACKET_HDR])
		return;
	const struct nfqnl_msg_packet_hdr *ph = mnl_attr_get_payload(attr[NFQA_PACKET_HDR]);
	/* The hold runs from when the kernel queued the packet, not from this read. */
	uint64_t waited = 0;
	if (attr[NFQA_TIMESTAMP]) {
		const struct nfqnl_msg_packet_timestamp *ts = mnl_attr_get_payload(attr[NFQA_TIMESTAMP]);
		uint64_t queued = be64toh(ts->sec) * 1000000000u + be64toh(ts->usec) * 1000u;
		if (now_real > queued)
			waited = now_real - queued;
		if (waited > MAX_CATCH_UP_NS)
			waited = MAX_CATCH_UP_NS;
	}
	stats.packets++;
	hold(p, now_mono + p->delay_ns - (waited < p->delay_ns ? waited : p->delay_ns), ntohl(ph->packet_id));
}

/* Reads up to BATCH messages from one queue's socket; false when it had none. */
static bool read_queue(struct path *p)
{
	static char bufs[BATCH][MSG_BYTES];
	static struct iovec iov[BATCH];
	static struct mmsghdr msgs[BATCH];
	for (int k = 0; k < BATCH; k++) {
		iov[k] = (struct iovec){bufs[k], MSG_BYTES};
		msgs[k] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[k], .msg_iovlen = 1}};
	}
	int n = recvmmsg(mnl_socket_get_fd(p->nl), msgs, BATCH, MSG_DONTWAIT, NULL);
	stats.reads++;
	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR || errno == ENOBUFS)
			return false;
		die("recvmmsg");
	}
	uint64_t now_mono, now_real;
	clock_pair(&now_mono, &now_real);
	for (int k = 0; k < n; k++) {
		int len = (int)msgs[k].msg_len;
		for (const struct nlmsghdr *nlh = (const struct nlmsghdr *)bufs[k]; mnl_nlmsg_ok(nlh, len);
		     nlh = mnl_nlmsg_next(nlh, &len))
			if ((nlh->nlmsg_type & 0xff) == NFQNL_MSG_PACKET)
				on_packet(p, nlh, now_mono, now_real);
	}
	return n == BATCH;
}

static void count_late(const struct path *p, uint64_t late_ns)
{
	uint64_t bucket = late_ns / 10000;
	stats.late[prompt(p) ? PROMPT : LAZY][bucket < LATE_BUCKETS ? bucket : LATE_BUCKETS - 1]++;
}

/* Accepts every due packet, the earliest due first, at most VERDICT_MOST at a time: a verdict
 * returns only once the kernel has forwarded its packets (nfqnl_reinject runs the router's
 * forwarding and the receiving host's stack in this process's context), so a large batch of one
 * path would hold another path's packet that falls due meanwhile. The clock is read again after
 * each verdict. Returns the monotonic time the next packet is due, or 0. */
static uint64_t release_due(void)
{
	char buf[256];
	uint64_t now = clock_ns(CLOCK_MONOTONIC);
	while (heap_len && head_due(heap[0]) <= now) {
		struct path *p = heap[0];
		uint32_t last = 0;
		count_late(p, now - head_due(p)); /* the earliest released packet is the latest one */
		for (int n = 0; n < VERDICT_MOST && p->count && p->ring[p->head].due_ns <= now; n++) {
			last = p->ring[p->head].id;
			p->head = (p->head + 1) & (p->cap - 1);
			p->count--;
		}
		struct nlmsghdr *nlh = nfq_nlmsg_put(buf, NFQNL_MSG_VERDICT_BATCH, p->queue);
		nfq_nlmsg_verdict_put(nlh, (int)last, NF_ACCEPT);
		if (mnl_socket_sendto(p->nl, nlh, nlh->nlmsg_len) < 0)
			die("sending a verdict");
		stats.verdicts++;
		if (p->count) {
			heap_down(0);
		} else {
			p->heap_pos = SIZE_MAX;
			heap[0] = heap[--heap_len];
			if (heap_len) {
				heap[0]->heap_pos = 0;
				heap_down(0);
			}
		}
		now = clock_ns(CLOCK_MONOTONIC);
	}
	return heap_len ? head_due(heap[0]) : 0;
}

/* The upper bounds (us) of the buckets holding the p50 and the p99 of `kinds` of late counts. */
static void late_quantiles(const int *kinds, int nkinds, uint64_t *p50, uint64_t *p99)
{
	uint64_t releases = 0, seen = 0;
	*p50 = *p99 = 0;
	for (int k = 0; k < LATE_BUCKETS; k++)
		for (int i = 0; i < nkinds; i++)
			releases += stats.late[kinds[i]][k];
	for (int k = 0; k < LATE_BUCKETS && releases; k++) {
		for (int i = 0; i < nkinds; i++)
			seen += stats.late[kinds[i]][k];
		if (!*p50 && seen * 2 >= releases)
			*p50 = (uint64_t)(k + 1) * 10;
		if (!*p99 && seen * 100 >= releases * 99)
			*p99 = (uint64_t)(k + 1) * 10;
	}
}

static void print_stats(void)
{
	static const int all[] = {PROMPT, LAZY}, prompt[] = {PROMPT}, lazy[] = {LAZY};
	uint64_t p50, p99, prompt50, prompt99, lazy50, lazy99;
	late_quantiles(all, 2, &p50, &p99);
	late_quantiles(prompt, 1, &prompt50, &prompt99);
	late_quantiles(lazy, 1, &lazy50, &lazy99);
	fprintf(stderr,
		"delay line: %" PRIu64 " packets in %" PRIu64 " reads, %" PRIu64 " wake-ups, %" PRIu64
		" verdicts; releases late by at most %" PRIu64 " us at p50, %" PRIu64 " us at p99 (delays under %d ms: %"
		PRIu64 " and %" PRIu64 " us; longer: %" PRIu64 " and %" PRIu64 " us)\n",
		stats.packets, stats.reads, stats.wakeups, stats.verdicts, p50, p99, LAZY_DELAY_NS / 1000000, prompt50,
		prompt99, lazy50, lazy99);
}

/* Binds one queue on its own socket and waits for the kernel's ack: 0, or the kernel's errno
 * (a queue another process holds: EBUSY). */
static int bind_queue(struct path *p)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	p->nl = mnl_socket_open(NETLINK_NETFILTER);
	if (!p->nl || mnl_socket_bind(p->nl, 0, MNL_SOCKET_AUTOPID) < 0)
		die("opening a netlink socket");
	p->portid = mnl_socket_get_portid(p->nl);
	int fd = mnl_socket_get_fd(p->nl), on = 1, rcvbuf = RCVBUF_BYTES;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) < 0)
		die("SO_RCVBUFFORCE");
	/* A message lost to a full buffer is harmless: the next batch verdict accepts its packet. */
	mnl_socket_setsockopt(p->nl, NETLINK_NO_ENOBUFS, &on, sizeof(on));

	struct nlmsghdr *nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, p->queue);
	nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
	nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
	nfq_nlmsg_cfg_put_qmaxlen(nlh, QUEUE_MAXLEN);
	mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(NFQA_CFG_F_GSO));
	mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(NFQA_CFG_F_GSO));
	nlh->nlmsg_flags |= NLM_F_ACK;
	nlh->nlmsg_seq = 1;
	if (mnl_socket_sendto(p->nl, nlh, nlh->nlmsg_len) < 0)
		die("binding a queue");
	for (;;) { /* packets may arrive before the ack: hold them */
		int len = (int)mnl_socket_recvfrom(p->nl, buf, sizeof(buf));
		if (len < 0)
			die("waiting for a queue's ack");
		uint64_t now_mono, now_real;
		clock_pair(&now_mono, &now_real);
		for (nlh = (struct nlmsghdr *)buf; mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) {
			if (nlh->nlmsg_type == NLMSG_ERROR && nlh->nlmsg_seq == 1) {
				const struct nlmsgerr *err = mnl_nlmsg_get_payload(nlh);
				if (err->error)
					fprintf(stderr, "delay line: binding NFQUEUE %u: %s\n", p->queue, strerror(-err->error));
				return -err->error;
			}
			if ((nlh->nlmsg_type & 0xff) == NFQNL_MSG_PACKET)
				on_packet(p, nlh, now_mono, now_real);
		}
	}
}

/* Waits until `target` or until a prompt queue has a packet; `read_began`: when the last read of
 * the queues began. A packet not read by then arrived after it, and falls due at least the shortest
 * prompt delay later: a target before that needs no wake-up for arrivals (on a path of a test, one
 * a packet, each a context switch that cost this process a third of its CPU in a VM; perf record).
 * A timer wakes this process some tens of microseconds late on a VM, which would add to every
 * delay: so it asks to be woken that much early (the lateness seen so far, a moving average) and
 * spins the rest. */
static void wait_until(uint64_t target, uint64_t read_began)
{
	static uint64_t early_ns;
	struct epoll_event event;
	uint64_t now = clock_ns(CLOCK_MONOTONIC); /* not the caller's: releases may have taken a while */
	if (target <= now)
		return;
	uint64_t ask = target - (early_ns < target - now ? early_ns : target - now);
	struct timespec left = {(time_t)((ask - now) / 1000000000u), (long)((ask - now) % 1000000000u)};
	bool arrivals_can_wait = shortest_prompt_ns != UINT64_MAX && target - read_began <= shortest_prompt_ns;
	if (arrivals_can_wait ? ppoll(NULL, 0, &left, &waiting_mask) != 0
			  : epoll_pwait2(ep_prompt, &event, 1, &left, &waiting_mask) != 0)
		return; /* a packet to read, or a signal */
	now = clock_ns(CLOCK_MONOTONIC);
	int64_t late = (int64_t)(now - ask) < MAX_WAKE_EARLY_NS ? (int64_t)(now - ask) : MAX_WAKE_EARLY_NS;
	early_ns = (uint64_t)((int64_t)early_ns + (late - (int64_t)early_ns) / 16);
	while (now < target)
		now = clock_ns(CLOCK_MONOTONIC);
}

/* Reads every ready queue's socket, in turns of BATCH messages, until all are drained, releasing
 * what falls due in between; waits up to `timeout_ms` (-1: for ever) for one to be ready. Returns
 * false when more sockets may have been ready than one wait reports (some left to read). */
static bool read_ready(int timeout_ms)
{
	struct epoll_event events[64];
	struct path *busy[64];
	int n = epoll_pwait(ep_all, events, 64, timeout_ms, &waiting_mask);
	if (n < 0 && errno != EINTR)
		die("epoll_wait");
	size_t nbusy = 0;
	for (int k = 0; k < n; k++) {
		if (events[k].data.ptr)
			busy[nbusy++] = events[k].data.ptr;
		else
			on_control();
	}
	while (nbusy) {
		size_t still = 0;
		for (size_t k = 0; k < nbusy; k++)
			if (read_queue(busy[k]))
				busy[still++] = busy[k];
		nbusy = still;
		if (nbusy)
			release_due();
	}
	return n < 64;
}

/* One "QUEUE:SECONDS"; false when it is not one (queue 0-65535, 0-10 s). */
static bool parse_spec(const char *spec, uint16_t *queue, uint64_t *delay_ns)
{
	char *end;
	unsigned long q = strtoul(spec, &end, 10);
	if (end == spec || *end != ':')
		return false;
	const char *seconds = end + 1;
	double delay = strtod(seconds, &end);
	if (end == seconds || *end || q > 65535 || !(delay >= 0 && delay <= 10))
		return false;
	*queue = (uint16_t)q;
	*delay_ns = (uint64_t)(delay * 1e9 + 0.5);
	return true;
}

/* The arguments: [--control PATH] QUEUE:SECONDS ...; returns the index of the first delay.
 * Exits 2 naming a bad argument. */
static int check_args(int argc, char **argv)
{
	int first = 1;
	if (argc > 2 && strcmp(argv[1], "--control") == 0) {
		control_path = argv[2];
		first = 3;
		if (strlen(control_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
			fprintf(stderr, "delay line: argument 2 (%s): a control socket path this long cannot be bound\n",
				control_path);
			exit(2);
		}
	}
	if (first >= argc) {
		fprintf(stderr, "usage: %s [--control PATH] QUEUE:SECONDS [QUEUE:SECONDS ...]\n", argv[0]);
		exit(2);
	}
	for (int k = first; k < argc; k++) {
		uint16_t queue;
		uint64_t delay_ns;
		if (!parse_spec(argv[k], &queue, &delay_ns)) {
			fprintf(stderr, "delay line: argument %d (%s): want QUEUE:SECONDS, queue 0-65535, 0-10 s\n", k,
				argv[k]);
			exit(2);
		}
	}
	return first;
}

static struct path *find_path(uint16_t queue)
{
	for (size_t k = 0; k < npaths; k++)
		if (paths[k]->queue == queue)
			return paths[k];
	return NULL;
}

/* Called after any queue's delay changes (shortest_prompt_ns). */
static void note_shortest_prompt(void)
{
	shortest_prompt_ns = UINT64_MAX;
	for (size_t k = 0; k < npaths; k++)
		if (prompt(paths[k]) && paths[k]->delay_ns < shortest_prompt_ns)
			shortest_prompt_ns = paths[k]->delay_ns;
}

/* A queue at a delay: an existing one takes it (joining or leaving the prompt set), a new one is
 * bound and watched. Returns 0, or the errno of a new queue's bind (nothing is then changed). */
static int set_delay(uint16_t queue, uint64_t delay_ns)
{
	struct path *p = find_path(queue);
	if (p) {
		bool was_prompt = prompt(p);
		p->delay_ns = delay_ns;
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};
		int fd = mnl_socket_get_fd(p->nl);
		if (was_prompt != prompt(p) &&
		    epoll_ctl(ep_prompt, prompt(p) ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev) < 0)
			die("epoll_ctl");
		note_shortest_prompt();
		return 0;
	}
	if (npaths == paths_cap) { /* before the bind: packets held while it waits go on the heap */
		paths_cap = paths_cap ? paths_cap * 2 : 64;
		paths = realloc(paths, paths_cap * sizeof(*paths));
		heap = realloc(heap, paths_cap * sizeof(*heap));
		if (!paths || !heap)
			die("out of memory");
	}
	p = malloc(sizeof(*p));
	if (!p)
		die("out of memory");
	*p = (struct path){.queue = queue, .delay_ns = delay_ns, .heap_pos = SIZE_MAX};
	raise_fd_limit();
	int err = bind_queue(p);
	if (err) { /* refused: no packet came to it */
		mnl_socket_close(p->nl);
		free(p);
		return err;
	}
	paths[npaths++] = p;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};
	int fd = mnl_socket_get_fd(p->nl);
	if (epoll_ctl(ep_all, EPOLL_CTL_ADD, fd, &ev) < 0 ||
	    (prompt(p) && epoll_ctl(ep_prompt, EPOLL_CTL_ADD, fd, &ev) < 0))
		die("epoll_ctl");
	note_shortest_prompt();
	return 0;
}

/* A control line: "QUEUE:SECONDS ..." (none: no change) and a newline. Every delay is checked
 * before any applies. Returns the answer: "ok", or "error: ..." (a queue that could not be
 * bound: the ones before it in the line took their delays). */
static const char *apply_line(char *line)
{
	static struct {
		uint16_t queue;
		uint64_t delay_ns;
	} wanted[CONTROL_BYTES / 4]; /* "Q:S " is 4 bytes at the least */
	static char answer[128];
	const size_t most = sizeof(wanted) / sizeof(wanted[0]);
	size_t n = 0;
	char *end = strchr(line, '\n'), *save;
	if (!end)
		return "error: want one line of QUEUE:SECONDS, queue 0-65535, 0-10 s\n";
	*end = '\0';
	for (char *token = strtok_r(line, " ", &save); token; token = strtok_r(NULL, " ", &save), n++)
		if (n == most || !parse_spec(token, &wanted[n].queue, &wanted[n].delay_ns))
			return "error: want one line of QUEUE:SECONDS, queue 0-65535, 0-10 s\n";
	for (size_t k = 0; k < n; k++) {
		int err = set_delay(wanted[k].queue, wanted[k].delay_ns);
		if (err) {
			snprintf(answer, sizeof(answer), "error: binding NFQUEUE %u: %s\n", wanted[k].queue, strerror(err));
			return answer;
		}
	}
	fprintf(stderr, "delay line: %zu delays set through the control socket\n", n);
	return "ok\n";
}

/* One request on the control socket (see the usage at the top), answered once it applies. */
static void on_control(void)
{
	static char line[CONTROL_BYTES];
	int conn = accept4(control_fd, NULL, NULL, SOCK_CLOEXEC);
	if (conn < 0)
		return;
	/* The packets wait while a request is read: a client that sends no line holds them 0.1 s at most. */
	struct timeval patience = {.tv_usec = 100000};
	setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(line) - 1 && !memchr(line, '\n', len) &&
	       (n = recv(conn, line + len, sizeof(line) - 1 - len, 0)) > 0)
		len += (size_t)n;
	line[len] = '\0';
	const char *answer = apply_line(line);
	send(conn, answer, strlen(answer), MSG_NOSIGNAL);
	close(conn);
}

/* Listens on the control socket; a stale one (a killed run's) is replaced. */
static void listen_control(void)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	strcpy(addr.sun_path, control_path); /* its length was checked with the arguments */
	unlink(control_path);
	control_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (control_fd < 0 || bind(control_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(control_fd, 4) < 0)
		die("listening on the control socket");
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (epoll_ctl(ep_all, EPOLL_CTL_ADD, control_fd, &ev) < 0)
		die("epoll_ctl");
}

/* Timer wake-ups are the delay's error: 1 ns slack instead of 50 us, a real-time priority,
 * and no page faults. Without the privileges (a container) it runs, less precise. */
static void tighten_timers(void)
{
	prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
	struct sched_param param = {.sched_priority = REALTIME_PRIORITY};
	if (sched_setscheduler(0, SCHED_FIFO, &param) < 0)
		fprintf(stderr, "delay line: no real-time priority (%s); releases may be late under load\n",
			strerror(errno));
	mlockall(MCL_CURRENT | MCL_FUTURE);
}

/* A socket per queue: a large lab has more queues than the default 1,024 descriptors. Called
 * before each queue is bound. */
static void raise_fd_limit(void)
{
	struct rlimit lim;
	rlim_t want = (rlim_t)npaths + 64;
	if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < want) {
		lim.rlim_cur = want;
		if (lim.rlim_max < want)
			lim.rlim_max = want;
		if (setrlimit(RLIMIT_NOFILE, &lim) < 0)
			die("raising the open-file limit for one socket per queue");
	}
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		report_asked = 1;
	else
		stop_asked = 1;
}

int main(int argc, char **argv)
{
	int first = check_args(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	/* The signals it handles come only while it waits for packets (waiting_mask): one that came
	 * just before a wait ends that wait, and no other call is cut short by one. */
	struct sigaction action = {.sa_handler = on_signal};
	sigaction(SIGUSR1, &action, NULL);
	sigaction(SIGTERM, &action, NULL);
	sigaction(SIGINT, &action, NULL);
	sigset_t handled;
	sigemptyset(&handled);
	sigaddset(&handled, SIGUSR1);
	sigaddset(&handled, SIGTERM);
	sigaddset(&handled, SIGINT);
	sigprocmask(SIG_BLOCK, &handled, &waiting_mask);
	tighten_timers();
	/* The kernel stamps packets on receive only while some socket asks for stamps (a global
	 * switch); hold one open so that every queued packet carries NFQA_TIMESTAMP. */
	int stamps = socket(AF_INET, SOCK_DGRAM, 0), on = 1;
	if (stamps < 0 || setsockopt(stamps, SOL_SOCKET, SO_TIMESTAMPNS_OPT, &on, sizeof(on)) < 0)
		die("enabling receive timestamps");

	ep_all = epoll_create1(0);
	ep_prompt = epoll_create1(0);
	if (ep_all < 0 || ep_prompt < 0)
		die("epoll_create1");
	for (int k = first; k < argc; k++) {
		uint16_t queue;
		uint64_t delay_ns;
		parse_spec(argv[k], &queue, &delay_ns); /* checked */
		if (set_delay(queue, delay_ns))
			exit(1);
	}
	if (control_path)
		listen_control();
	printf("ready\n");
	fflush(stdout);

	uint64_t last_read = 0, read_began = 0;
	while (!stop_asked) {
		if (report_asked) {
			report_asked = 0;
			print_stats();
		}
		uint64_t next = release_due();
		if (next)
			wait_until(next < last_read + LAZY_READ_NS ? next : last_read + LAZY_READ_NS, read_began);
		stats.wakeups++;
		uint64_t began = clock_ns(CLOCK_MONOTONIC);
		bool drained = read_ready(next ? 0 : -1); /* nothing held: wait for any packet or request */
		read_began = drained ? began : 0;         /* 0: packets left unread, wake for them */
		last_read = clock_ns(CLOCK_MONOTONIC);
	}
	if (control_path)
		unlink(control_path);
	print_stats();
	return 0;
}
