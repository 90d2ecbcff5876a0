/*
 * persist_pool.c - DIR in bounded time: the pool of threads that runs what
 * a request asks of DIR (persist_int.h says how), its jobs, and the freeing
 * of what the jobs return (a listing's entries, a set's files).
 *
 * Calls: persist_path.c (the clock of progress).  Locks: pg.lock
 * (LR_PERSIST_POOL) guards the pool, its jobs' references and done flags,
 * and the hung state; it is taken under fs.nslock and directories' ilocks,
 * never with pq.lock, and nothing but the log's lock is taken under it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/log.h"

/* The pool of DIR's requests (pg.lock). */
struct persist_pool pg = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
	.timeout = 10.0,
};

void fs_persist_files_free(struct fs_pfile *files, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(files[i].name);
	free(files);
}

void persist_pjob_put(struct pjob *j)
{
	bool last;

	pg_lock();
	last = --j->refs == 0;
	pg_unlock();
	if (!last)
		return;
	if (j->in)
		fs_inode_put(j->in);
	if (j->fd >= 0)
		close(j->fd);
	fs_persist_snap_free(j->snap);
	free(j->text);
	fs_persist_files_free(j->files, j->nfiles);
	free(j);
}

static void *pg_thread(void *arg)
{
	(void)arg;
	pg_lock();
	for (;;) {
		struct pjob *j;

		pg.idle++;
		while (!pg.head)
			pthread_cond_wait(&pg.work, &pg.lock);
		pg.idle--;
		j = pg.head;
		pg.head = j->next;
		if (!pg.head)
			pg.tail = NULL;
		if (!__atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) {
			pg_unlock();
			j->ret = j->fn(j);
			pg_lock();
			if (pg.hung) {
				pg.hung = false;
				tlog(LOG_NOTICE, "persist: %s answers again", pq.dir);
			}
		}
		j->done = true;
		pthread_cond_broadcast(&pg.done);
		pg_unlock();
		persist_pjob_put(j);
		pg_lock();
	}
	return NULL;
}

/*
 * Run j->fn in the pool; wait while it makes progress.  True: it ran, and
 * j->ret and its outputs are j's; false: DIR did not answer (now or
 * before).  The caller puts j either way.
 */
bool persist_pg_run(struct pjob *j, const char *what)
{
	uint64_t limit = (uint64_t)(pg.timeout * 1000.0);
	bool answered;

	j->alive = persist_now_ms();
	pg_lock();
	if (pg.hung) {
		pg_unlock();
		return false;
	}
	if (!pg.idle && pg.threads < PG_THREADS) {
		pthread_t t;
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, pg_thread, NULL) == 0)
			pg.threads++;
		pthread_attr_destroy(&a);
	}
	if (!pg.threads) {	/* no thread: ask DIR here, unbounded */
		pg_unlock();
		j->ret = j->fn(j);
		return true;
	}
	j->refs++;		/* the pool's */
	j->next = NULL;
	if (pg.tail)
		pg.tail->next = j;
	else
		pg.head = j;
	pg.tail = j;
	pthread_cond_signal(&pg.work);
	while (!j->done) {
		struct timespec ts;
		uint64_t alive = __atomic_load_n(&j->alive, __ATOMIC_RELAXED);
		uint64_t now = persist_now_ms();

		if (now >= alive + limit) {
			__atomic_store_n(&j->cancel, true, __ATOMIC_RELAXED);
			pg.timeouts++;
			if (!pg.hung)
				tlog(LOG_ERR, "persist: %s does not answer (%s: nothing for %.3g s); "
				     "until it does, names that the backing directory lacks are "
				     "absent and listings show the backing directory only", pq.dir,
				     what, pg.timeout);
			pg.hung = true;
			break;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t wait = alive + limit - now;

		if (wait > 1000)
			wait = 1000;
		ts.tv_sec += (time_t)(wait / 1000);
		ts.tv_nsec += (long)(wait % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&pg.done, &pg.lock, &ts);
	}
	answered = j->done;
	pg_unlock();
	return answered;
}

struct pjob *persist_pjob_new(int (*fn)(struct pjob *))
{
	struct pjob *j = calloc(1, sizeof(*j));

	if (j) {
		j->fn = fn;
		j->fd = -1;
		j->refs = 1;
	}
	return j;
}

void fs_persist_snap_free(struct fs_psnap *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		free(s->e[i].name);
	free(s->e);
	free(s);
}
