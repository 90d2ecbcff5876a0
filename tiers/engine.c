/*
 * engine.c - the engine's life: create and destroy (one stop_threads()),
 * the GPU builder thread, a file's set-up, teardown and attributes, and
 * the statistics.
 *
 * Owns: struct engine's configuration, thread handles and tier list; the
 * tfile fields no other room changes (destroying, unlinked).  Calls every
 * other room's start and drain functions; takes e->lock (and no
 * tfile.lock: tfile_destroy() and tfile_unlinked() are called by the fs
 * side with fs.lock held, see lockorder.h).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "balance.h"
#include "dedup_flush.h"
#include "engine_int.h"
#include "ssd.h"
#include "gpu.h"
#include "gpu_tier.h"
#include "json.h"

static void *gbuilder_main(void *arg);

/*
 * Start the toucher and the GPU builder (once).  Both hold up the rest of
 * the process while they work: faulting the host buffer in holds the
 * address space's lock, which every new thread's stack mapping waits for,
 * and loading the CUDA driver library holds the dynamic loader's lock
 * (about half a second of constructors), which pthread_create() waits for.
 * So they start after the threads that serve requests exist.
 */
void engine_start_background(struct engine *e)
{
	if (!e->toucher_started && pthread_create(&e->toucher, NULL, eng_toucher_main, e) == 0)
		e->toucher_started = true;
	if (e->cfg.gpu_dev >= 0 && !e->gbuilder_started &&
	    pthread_create(&e->gbuilder, NULL, gbuilder_main, e) == 0)
		e->gbuilder_started = true;
}

/* The GPU builder has ended, with or without a tier: wake its waiters. */
static void gpu_decided(struct engine *e)
{
	eng_lock(e);
	e->gpu_decided = true;
	pthread_cond_broadcast(&e->gpu_built);
	eng_unlock(e);
}

/* Build the GPU tier (CUDA start-up, VMM reservation) off the mount's path. */
static void *gbuilder_main(void *arg)
{
	struct engine *e = arg;
	struct gpu_tier *g;
	char msg[256] = "";
	bool ok = false;

	int devs[ENGINE_MAX_GPUS] = { e->cfg.gpu_dev };
	unsigned ndev = 1 + e->cfg.gpu_nmore;

	_Static_assert(ENGINE_MAX_GPUS == GPU_MAX_DEVICES, "one limit of GPUs per mount");
	if (ndev > ENGINE_MAX_GPUS)
		ndev = ENGINE_MAX_GPUS;
	for (unsigned i = 1; i < ndev; i++)
		devs[i] = e->cfg.gpu_more[i - 1];
	if (e->cfg.gpu_all)
		ndev = 0;
	if (gpu_tier_create(&g, devs, ndev, e->cfg.gpu_cache, e->cfg.gpu_share,
			    e->cfg.policy, msg, sizeof(msg))) {
		tlog(LOG_NOTICE, "GPU tier: not available (%s); using host + SSD", msg);
		gpu_decided(e);
		return NULL;
	}
	eng_lock(e);
	if (!e->stop) {
		struct cache *gc = gpu_tier_cache(g);

		gc->priv = e;
		e->tiers[0] = gc;	/* the placeholder never held a copy */
		/* published: engine_has_gpu() reads it without e->lock */
		__atomic_store_n(&e->gpu, g, __ATOMIC_RELEASE);
		if (pthread_create(&e->gflusher, NULL, eng_gflusher_main, e) == 0)
			e->gflusher_started = true;
		ok = true;
	}
	e->gpu_decided = true;
	pthread_cond_broadcast(&e->gpu_built);
	eng_unlock(e);
	if (!ok) {
		gpu_tier_destroy(g);
		return NULL;
	}
	tlog(LOG_NOTICE, "GPU tier: %s", msg);
	eng_pin_host_once(e);
	return NULL;
}

/*
 * Tell every thread to stop and wait for each that was started: the GPU
 * builder, the flushers (they drain the flush queue first), the toucher,
 * the prefetcher and the GPU -> host cascade.
 */
static void stop_threads(struct engine *e)
{
	int i;

	eng_lock(e);
	/* atomic: the toucher reads it without the lock (host.c) */
	__atomic_store_n(&e->stop, true, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&e->gpu_built);
	eng_flush_work(e);
	eng_cascade_work(e);
	eng_prefetch_work(e);
	eng_unlock(e);
	if (e->gbuilder_started)
		pthread_join(e->gbuilder, NULL);
	for (i = 0; i < e->nflushers; i++)
		pthread_join(e->flushers[i], NULL);
	free(e->flushers);
	e->flushers = NULL;
	if (e->toucher_started)
		pthread_join(e->toucher, NULL);
	if (e->prefetcher_started)
		pthread_join(e->prefetcher, NULL);
	if (e->gflusher_started)
		pthread_join(e->gflusher, NULL);
}

/* e's configuration (cfg, its defaults filled in), its locks and
 * conditions, and what must be there before any thread runs. */
static void engine_init_state(struct engine *e, const struct engine_config *cfg)
{
	e->cfg = *cfg;
	if (!e->cfg.flush_threads)	/* a flush waits on its syncs more than on
					 * bandwidth: 4 (bench/RESULTS.md 18g) */
		e->cfg.flush_threads = 4;
	eng_batch_files(e);
	if (!e->cfg.queue_depth)
		e->cfg.queue_depth = 32;
	if (!e->cfg.chunk)	/* the largest request of a usual disk (NVMe,
				 * virtio): fewer, larger writes reached the
				 * disk's speed where 1 MiB fell short
				 * (bench/RESULTS.md 13f) */
		e->cfg.chunk = 4u << 20;
	e->dd.dup = 1.0;	/* until flushes say otherwise */
	if (e->cfg.dedup && e->cfg.dedup_chunk && dd_index_init(&e->dd.index, e->cfg.dedup_index))
		tlog(LOG_WARNING, "dedup: no memory for the chunk index: whole new files "
		     "are not de-duplicated");
	if (!e->cfg.policy)
		e->cfg.policy = &evict_fifo;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->unpinned, NULL);
	pthread_cond_init(&e->settled, NULL);
	pthread_cond_init(&e->room, NULL);
	pthread_cond_init(&e->flushed, NULL);
	pthread_cond_init(&e->gpu_built, NULL);
	pthread_cond_init(&e->flush_work, NULL);
	pthread_cond_init(&e->cascade_work, NULL);
	pthread_cond_init(&e->prefetch_work, NULL);
	eng_hint_init(e);		/* before any thread hashes a name */
	e->flush_bw = 1e9;
}

/*
 * e's host cache, size bytes mapped at e->host_buf, and the GPU tier's
 * slot (an empty placeholder until the GPU builder fills it) where the
 * mount has a GPU: its tiers, fastest first.  0 or -errno (nothing left
 * mapped).
 */
static int engine_init_tiers(struct engine *e, uint64_t size)
{
	int ret;

	e->host_buf = mmap(NULL, size, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (e->host_buf == MAP_FAILED) {
		ret = -errno;
		tlog(LOG_ERR, "cannot map a %" PRIu64 "-byte host cache: %s",
		     size, strerror(errno));
		return ret;
	}
	if (e->cfg.hugepages)
		madvise(e->host_buf, size, MADV_HUGEPAGE);
	ret = cache_init(&e->host, "host", 1, e->host_buf, size, &tier_host_ops,
			 e->cfg.policy);
	if (ret)
		goto err_unmap;
	e->host.priv = e;
	e->host.host_addressable = true;
	if (e->cfg.gpu_dev >= 0) {
		/*
		 * The GPU tier is built in the background (gbuilder_main): the
		 * mount serves writes, into the host tier, from the start.  Its
		 * slot holds an empty placeholder until then.
		 */
		ret = cache_init(&e->gpu_slot, "gpu", 0, e->host_buf, TIER_ALIGN,
				 &tier_host_ops, e->cfg.policy);
		if (ret) {
			cache_destroy(&e->host);
			goto err_unmap;
		}
		e->gpu_slot.usable = 0;
		e->gpu_slot.priv = e;
		e->tiers[e->ntiers++] = &e->gpu_slot;
	}
	e->tiers[e->ntiers++] = &e->host;
	return 0;

err_unmap:
	munmap(e->host_buf, size);
	return ret;
}

int engine_create(struct engine **out, const struct engine_config *cfg)
{
	struct engine *e = calloc(1, sizeof(*e));
	uint64_t size = tier_round(cfg->host_cache);
	int ret, i;

	if (!e)
		return -ENOMEM;
	engine_init_state(e, cfg);
	if (size < TIER_ALIGN)
		size = TIER_ALIGN;
	ret = engine_init_tiers(e, size);
	if (ret)
		goto err_free;

	e->prefetch_on = true;
	if (pthread_create(&e->prefetcher, NULL, eng_prefetcher_main, e) == 0)
		e->prefetcher_started = true;

	e->flushers = calloc((size_t)e->cfg.flush_threads, sizeof(pthread_t));
	if (!e->flushers) {
		ret = -ENOMEM;
		goto err_threads;
	}
	for (i = 0; i < e->cfg.flush_threads; i++) {
		ret = -pthread_create(&e->flushers[i], NULL, eng_flusher_main, e);
		if (ret)
			goto err_threads;
		e->nflushers++;
	}
	if (!cfg->later)
		engine_start_background(e);
	*out = e;
	return 0;

err_threads:
	stop_threads(e);
	if (e->gpu)
		gpu_tier_destroy(e->gpu);
	if (e->gpu_slot.head)
		cache_destroy(&e->gpu_slot);
	cache_destroy(&e->host);
	munmap(e->host_buf, size);
err_free:
	free(e);
	return ret;
}

void engine_destroy(struct engine *e)
{
	int i;

	stop_threads(e);
	while (e->gq_head) {
		struct tfile *f = e->gq_head;

		e->gq_head = f->gq_next;
		f->gqueued = false;
		f->ops->put(f);
	}
	eng_hint_destroy(e);
	while (e->nreap) {
		struct tfile *r = e->reap[--e->nreap];

		r->ops->put(r);
	}
	free(e->reap);
	eng_dd_destroy(e);
	/* files still queued hold a reference; the fs frees them */
	while (e->q_head || e->aq_head) {
		struct tfile *f = e->q_head ? e->q_head : e->aq_head;

		if (f == e->q_head)
			e->q_head = f->fq_next;
		else
			e->aq_head = f->fq_next;
		f->queued = f->aging = false;
		f->ops->put(f);
	}
	/* copies of files the fs never freed (it exits right after) */
	for (i = 0; i < e->ntiers; i++) {
		struct cache *c = e->tiers[i];
		struct frag *fr;

		while (c->used) {
			for (fr = c->head; fr && !fr->copy; fr = fr->next)
				;
			if (!fr)
				break;
			struct copy *cp = fr->copy;

			cp->file->destroying = true;
			cache_release(c, cp);
			eng_copy_evicted(cp);
		}
	}
	if (e->gpu) {
		gpu_tier_unpin_host(e->host_buf, &e->host_pinned);
		gpu_tier_destroy(e->gpu);
	}
	if (e->gpu_slot.head)
		cache_destroy(&e->gpu_slot);
	munmap(e->host_buf, e->host.size);
	cache_destroy(&e->host);
	free(e);
}

uint64_t engine_host_cache_size(struct engine *e)
{
	return e->host.size;
}

/* ---- files ------------------------------------------------------------ */

void tfile_init(struct tfile *f, struct engine *e, const struct tfile_ops *ops,
		uint64_t size)
{
	memset(f, 0, sizeof(*f));
	f->eng = e;
	f->ops = ops;
	f->size = size;
	f->shadow_fd = -1;
	f->gpu_wdev = -1;
	f->gpu_rdev = -1;
	pthread_mutex_init(&f->lock, NULL);
}

void tfile_destroy(struct tfile *f)
{
	struct engine *e = f->eng;
	int i;

	eng_lock(e);
	f->destroying = true;
	eng_shadow_unqueued(e, f);
	eng_dd_retire(e, f);
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (cp)
			backlog_del(e, cp);
		eng_drop_copy(e, f, i);
	}
	eng_unlock(e);
	/* a journal record not applied yet: of a file gone with all its
	 * names (a file with a name keeps a reference while dirty) */
	if (f->jseq && f->ops->journal_retire)
		f->ops->journal_retire(f, f->jseq);
	f->jseq = 0;
	eng_shadow_committed(f, -ENOENT);	/* its records: of a file gone */
	if (f->slog) {
		dset_free(&f->slog->ranges);
		dset_free(&f->slog->all);
	}
	free(f->slog);
	f->slog = NULL;
	if (f->shadow_fd >= 0)
		close(f->shadow_fd);
	f->shadow_fd = -1;
	dset_free(&f->dd.ranges);
	free(f->dd.gh.h);
	f->dd.gh.h = NULL;
	pthread_mutex_destroy(&f->lock);
}

bool engine_has_gpu(struct engine *e)
{
	return __atomic_load_n(&e->gpu, __ATOMIC_ACQUIRE) != NULL;
}

bool engine_wait_gpu(struct engine *e, double max_s)
{
	double until = tier_now() + max_s;
	bool has;

	if (engine_has_gpu(e))
		return true;
	if (e->cfg.gpu_dev < 0)
		return false;	/* no GPU tier was asked for */
	eng_lock(e);
	while (!e->gpu && !e->gpu_decided && !e->stop && tier_now() < until)
		wait_ms(e, &e->gpu_built, 50);
	has = e->gpu != NULL;
	eng_unlock(e);
	return has;
}

struct gpu_tier *engine_gpu_tier(struct engine *e)
{
	struct gpu_tier *g;

	eng_lock(e);
	g = e->gpu;
	eng_unlock(e);
	return g;
}

void tfile_unlinked(struct tfile *f)
{
	struct engine *e = f->eng;
	struct copy *cp;

	eng_lock(e);
	f->unlinked = true;
	eng_dd_retire(e, f);
	for (int i = 0; i < e->ntiers; i++) {
		cp = f->copy[i];
		if (!cp)
			continue;
		backlog_del(e, cp);	/* its flush is cancelled */
		cp->promoted = false;	/* no restore will read it by name */
		if (cp->fileref) {	/* see eng_attach_copy() */
			cp->fileref = false;
			eng_defer_put(e, f);
		}
	}
	/* its restore-queue entries name a file that is gone: they wait for
	 * the next file of that name, as entries written before it do */
	eng_hint_unbind_file(e, f);
	eng_hint_head_update(e);
	eng_room(e);		/* nothing of it is promoted now */
	eng_flushed(e);
	eng_unlock(e);
}

void tfile_orphaned(struct tfile *f)
{
	struct engine *e = f->eng;

	eng_lock(e);
	f->unlinked = true;
	f->orphaned = true;
	for (int i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp)
			continue;
		cp->discarded = true;
		if (tier_copy_evictable(cp))	/* never waits: unpinned */
			eng_discard_copy(e, f, i);
	}
	eng_unlock(e);
}

void tfile_set_linked(struct tfile *f, bool linked)
{
	__atomic_store_n(&f->linked, linked, __ATOMIC_RELAXED);
}

bool tfile_attr(struct tfile *f, uint64_t *size, struct timespec *mtime)
{
	bool dirty;

	eng_lock(f->eng);
	dirty = f->dirty;
	*size = f->size;
	*mtime = f->mtime;
	eng_unlock(f->eng);
	return dirty;
}

void tfile_set_mtime(struct tfile *f, const struct timespec *mt)
{
	eng_lock(f->eng);
	f->mtime = *mt;
	eng_unlock(f->eng);
}

struct timespec tfile_mtime(struct tfile *f)
{
	struct timespec t;

	eng_lock(f->eng);
	t = f->mtime;
	eng_unlock(f->eng);
	return t;
}

int tfile_pending_error(struct tfile *f)
{
	int ret;

	eng_lock(f->eng);
	ret = f->flush_err ? f->flush_err : f->write_err;
	eng_unlock(f->eng);
	return ret;
}

void tfile_facts(struct tfile *f, struct tfile_facts *out)
{
	eng_lock(f->eng);
	out->writers = f->writers;
	out->restore_queued = f->hint_first != NULL;
	out->dirty = f->dirty || f->shadow_fd >= 0;
	out->flush_err = f->flush_err ? f->flush_err : f->write_err;
	eng_unlock(f->eng);
}

/*
 * With a GPU cache over several GPUs, "balance":{...}: the policy, where
 * copies went (their GPU's part, a peer's, host memory) and the links
 * measured at start-up (bytes/s: local, to each peer, to host memory, per
 * GPU in the parts' order).  Nothing with one GPU.  e->lock held.
 */
static void balance_json(struct engine *e, struct json *j)
{
	const struct gpu_links *l = gpu_tier_links(e->gpu);
	unsigned n = gpu_tier_ndevices(e->gpu);

	if (n < 2)
		return;
	json_obj(j, "balance");
	json_str(j, "policy", balance_policy_name((enum balance_policy)e->cfg.balance));
	json_u64(j, "own", e->bal_own);
	json_u64(j, "to_peer", e->bal_peer);
	json_u64(j, "to_peer_bytes", e->bal_peer_bytes);
	json_u64(j, "split", e->bal_split);
	json_u64(j, "to_host", e->bal_host);
	json_u64(j, "to_host_bytes", e->bal_host_bytes);
	json_bool(j, "links_measured", l->probed);
	json_arr(j, "links");
	for (unsigned i = 0; i < n && i < GPU_TIER_MAX_DEVICES; i++) {
		json_obj(j, NULL);
		json_int(j, "device_id", gpu_tier_part_device(e->gpu, i));
		json_num(j, "local", l->local[i], 0);
		json_num(j, "host", l->host[i], 0);
		json_arr(j, "peer");
		for (unsigned k = 0; k < n && k < GPU_TIER_MAX_DEVICES; k++)
			json_num(j, NULL, i == k ? 0.0 : l->peer[i][k], 0);
		json_close_arr(j);
		json_close(j);
	}
	json_close_arr(j);
	json_close(j);
}

/* Does the mount's GPU tier span GPU dev (or, while it is being built,
 * was it asked to)?  e->lock held. */
static bool gpu_spans(struct engine *e, int dev)
{
	struct gpu_tier *g = __atomic_load_n(&e->gpu, __ATOMIC_ACQUIRE);

	if (dev < 0 || dev >= 64)
		return false;
	if (g)
		return gpu_tier_part_of(g, dev) >= 0;
	if (e->cfg.gpu_dev < 0 || e->gpu_decided)
		return false;
	if (e->cfg.gpu_all || dev == e->cfg.gpu_dev)
		return true;
	for (unsigned i = 0; i < e->cfg.gpu_nmore; i++)
		if (e->cfg.gpu_more[i] == dev)
			return true;
	return false;
}

bool engine_gpu_spans(struct engine *e, int dev)
{
	struct gpu_tier *g = __atomic_load_n(&e->gpu, __ATOMIC_ACQUIRE);

	/* the tier's devices never change once it exists: no lock needed */
	return g && gpu_tier_ndevices(g) > 1 && dev >= 0 && gpu_tier_part_of(g, dev) >= 0;
}

int tfile_set_gpu_device(struct tfile *f, int dev)
{
	struct engine *e = f->eng;
	int ret = 0;

	eng_lock(e);
	if (dev < 0)
		f->gpu_rdev = -1;
	else if (gpu_spans(e, dev))
		f->gpu_rdev = dev;
	else
		ret = -ENODEV;
	eng_unlock(e);
	return ret;
}

int tfile_gpu_device(struct tfile *f)
{
	int dev;

	eng_lock(f->eng);
	dev = f->gpu_rdev >= 0 ? f->gpu_rdev : f->gpu_wdev;
	eng_unlock(f->eng);
	return dev;
}

int tfile_describe(struct tfile *f, char *tier, size_t tl, char *state, size_t sl)
{
	struct engine *e = f->eng;
	size_t a = 0, b = 0;
	int i;

	eng_lock(e);
	tier[0] = state[0] = 0;
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp)
			continue;
		a += (size_t)snprintf(tier + a, a < tl ? tl - a : 0, "%s%s",
				      a ? "," : "", cp->cache->name);
		b += (size_t)snprintf(state + b, b < sl ? sl - b : 0, "%s%s:%s",
				      b ? "," : "", cp->cache->name,
				      tier_state_name(cp->state));
	}
	if (!f->dirty || f->shadow_fd >= 0 || f->flushed_gen)
		a += (size_t)snprintf(tier + a, a < tl ? tl - a : 0, "%sssd", a ? "," : "");
	b += (size_t)snprintf(state + b, b < sl ? sl - b : 0, "%sssd:%s",
			      b ? "," : "",
			      f->shadow_fd >= 0 ? "WRITE_THROUGH" :
			      f->dirty ? (f->flush_err ? "FLUSH_FAILED" : "PENDING") :
			      "CURRENT");
	eng_unlock(e);
	return (a >= tl || b >= sl) ? -ERANGE : 0;
}


/* "NAME":{... a cache's members, left open for the tier's own. */
static void cache_json(struct cache *c, struct json *j)
{
	json_obj(j, c->name);
	json_u64(j, "capacity", c->size);
	json_u64(j, "usable", c->usable);
	json_u64(j, "used", c->used);
	json_u64(j, "fragments", c->nfrags);
	json_u64(j, "gaps", c->ngaps);
	json_u64(j, "hits", c->hits);
	json_u64(j, "late", c->late);
	json_u64(j, "misses", c->misses);
	json_u64(j, "evictions", c->evictions);
	json_u64(j, "evicted_bytes", c->evicted_bytes);
	json_u64(j, "evicted_queued", c->evicted_queued);
	json_str(j, "policy", c->policy->name);
}

static double rate(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s : 0.0;
}

/* e->lock held: files on the flush queue (waiting for a flusher, or for
 * their retry), whatever their bytes: a file emptied by a truncation, or
 * whose journal record waits for its apply, has none in the backlog; and
 * applies whose sync waits for a flusher (flush.c's asettle). */
static uint64_t flush_queued(const struct engine *e)
{
	uint64_t n = e->nasettle + e->asettling;

	for (const struct tfile *f = e->q_head; f; f = f->fq_next)
		n++;
	return n;
}

/* e->lock held: what the running flushes have written (or cloned) so far,
 * each capped at its copy's length (published without the lock). */
static uint64_t flush_done_bytes(struct engine *e)
{
	uint64_t sum = 0;

	for (struct copy *cp = e->fl_running; cp; cp = cp->fl_next) {
		uint64_t d = __atomic_load_n(&cp->flushed_bytes, __ATOMIC_RELAXED);

		sum += d < cp->len ? d : cp->len;
	}
	return sum;
}

void engine_stats_put(struct engine *e, struct json *j)
{
	uint64_t touched = __atomic_load_n(&e->touched, __ATOMIC_RELAXED);
	int i;

	eng_lock(e);
	json_obj(j, "tiers");
	for (i = 0; i < e->ntiers; i++) {
		struct cache *c = e->tiers[i];

		if (c == &e->gpu_slot)
			continue;	/* no GPU tier (yet) */
		cache_json(c, j);
		if (e->gpu && c == e->tiers[0]) {
			gpu_tier_stats_put(e->gpu, j);
			json_u64(j, "bytes_to_host", e->bytes_to_host);
			json_num(j, "to_host_bandwidth", rate(e->bytes_to_host, e->to_host_s), 0);
			json_u64(j, "client_writes", e->client_writes);
			json_u64(j, "client_reads", e->client_reads);
			json_u64(j, "client_bytes", e->client_bytes);
			balance_json(e, j);
		} else if (c == &e->host) {
			json_u64(j, "touched", touched);
			json_bool(j, "pinned", __atomic_load_n(&e->host_pinned, __ATOMIC_ACQUIRE));
		}
		json_close(j);
	}
	json_close(j);
	json_u64(j, "host_touched", touched);

	json_obj(j, "ssd");
	json_u64(j, "bytes_flushed", e->bytes_flushed);
	json_u64(j, "files_flushed", e->files_flushed);
	json_u64(j, "flush_errors", e->flush_errors);
	json_u64(j, "flush_backlog", e->backlog);
	json_int(j, "flushes_running", e->busy);
	json_u64(j, "flush_queued", flush_queued(e));
	json_u64(j, "flush_done_bytes", flush_done_bytes(e));
	json_u64(j, "flush_aging", e->aq_len);
	json_num(j, "flush_bandwidth", e->flush_bw, 0);
	json_u64(j, "bytes_written_through", e->bytes_written_through);
	json_u64(j, "files_written_through", e->files_written_through);
	json_u64(j, "write_through_records", e->write_through_records);
	json_u64(j, "write_through_early_commits", e->jheld_shadows);
	json_u64(j, "write_through_record_bytes", e->write_through_record_bytes);
	json_u64(j, "write_through_copy_bytes", e->write_through_copy_bytes);
	json_u64(j, "write_through_applies", e->write_through_applies);
	json_obj(j, "seconds");
	json_num(j, "total", e->fl_total_s, 6);
	json_num(j, "clone", e->fl_clone_s, 6);
	json_num(j, "sync", e->fl_sync_s, 6);
	json_num(j, "commit", e->fl_commit_s, 6);
	json_close(j);
	json_u64(j, "syncs", __atomic_load_n(&e->fl_syncs, __ATOMIC_RELAXED));
	json_close(j);

	json_obj(j, "prefetch");
	json_str(j, "state", e->prefetch_on ? "start" : "stop");
	json_u64(j, "queue", e->hq_len);
	json_u64(j, "unbound", e->hq_unbound);
	json_u64(j, "files_prefetched", e->files_prefetched);
	json_u64(j, "bytes_prefetched", e->bytes_prefetched);
	json_u64(j, "distance", eng_prefetch_distance(e));
	json_u64(j, "files_to_gpu", e->files_to_gpu);
	json_u64(j, "bytes_to_gpu", e->bytes_to_gpu);
	json_u64(j, "consumed", e->files_consumed);
	json_close(j);

	json_obj(j, "dedup");
	json_bool(j, "on", e->cfg.dedup);
	json_u64(j, "block", e->cfg.dedup_block);
	json_u64(j, "bytes_logical", e->dd.bytes_logical);
	json_u64(j, "bytes_written", e->dd.bytes_written);
	json_u64(j, "bytes_cloned", e->dd.bytes_cloned);
	json_u64(j, "files_incremental", e->dd.files_incremental);
	json_u64(j, "files_full", e->dd.files_full);
	json_u64(j, "files_dedup", e->dd.files_dedup);
	json_u64(j, "chunk", e->cfg.dedup_chunk);
	json_u64(j, "chunks_hashed", e->dd.chunks_hashed);
	json_u64(j, "chunks_found", e->dd.chunks_found);
	json_num(j, "hash_bandwidth", rate(e->dd.bytes_hashed, e->dd.hash_s), 0);
	json_u64(j, "sampled_out", e->dd.sampled_out);
	json_u64(j, "index_entries", e->dd.index.live);
	json_u64(j, "index_bytes", dd_index_bytes(&e->dd.index) + e->dd.cgen_bytes);
	json_u64(j, "versions_open", e->dd.nlive);
	json_u64(j, "versions_carried", e->dd.carried);
	json_u64(j, "gpu_chunks_hashed", e->dd.gpu_chunks);
	json_u64(j, "records", e->dd.records);
	json_u64(j, "bytes_recorded", e->dd.bytes_recorded);
	json_u64(j, "records_from_gpu", e->dd.records_gpu);
	json_num(j, "gpu_gather_seconds", e->dd.gather_s, 3);
	json_num(j, "pending_wait_seconds", e->dd.pending_s, 3);
	json_u64(j, "versions_pending", e->dd.versions_pending);
	json_u64(j, "gpu_records_left_to_flush", e->dd.records_left);
	json_num(j, "gpu_hash_bandwidth", rate(e->dd.gpu_bytes, e->dd.gpu_s), 0);
	json_close(j);
	eng_unlock(e);
}

int engine_stats_json(struct engine *e, char *buf, size_t len)
{
	struct json j;

	json_init(&j, buf, len);
	json_obj(&j, NULL);
	engine_stats_put(e, &j);
	json_close(&j);
	return json_end(&j);
}
