/*
 * gpu_dl.c - loading the CUDA driver at run time.
 *
 * Owns `gpu_cu`, the table of driver entry points that gpu_dl.h redirects
 * every cu*() call of gpu/ to.  gpu_dl_load() dlopen()s libcuda.so.1 and
 * dlsym()s each GPU_CU_FUNCS entry by its exported (versioned) name, once
 * per process; it fills `gpu_cu` only when every symbol resolved, so the
 * table is either complete or all NULL.  The library is never closed once
 * loaded: the primary context it hands out lives as long as the process.
 *
 * Callers: gpu_init() (the daemon) and gpu_ipc_export() (the client side,
 * which needs no gpu_init()).  Everything else in gpu/ reaches the table
 * only after gpu_init() succeeded (gpu_ctx_enter() checks), so it never
 * calls through a NULL slot.
 *
 * Threads: pthread_once() runs the loader exactly once and orders its
 * writes before every caller's return from it; `loaded` lets
 * gpu_dl_loaded() answer without taking part in the once.
 */
#define GPU_DL_NO_REDIRECT	/* the names below must stay unredirected */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "gpu_dl.h"

struct gpu_cu_table gpu_cu;

/* Stringize after macro expansion: cuMemAlloc -> "cuMemAlloc_v2". */
#define GPU_DL_STR_(s)	#s
#define GPU_DL_STR(s)	GPU_DL_STR_(s)
#define GPU_DL_SYM(f)	{ GPU_DL_STR(f), offsetof(struct gpu_cu_table, f) },
#define GPU_DL_COUNT(f)	+ 1

static const struct gpu_dl_sym {
	const char *name;	/* exported symbol, e.g. "cuMemAlloc_v2" */
	size_t off;		/* its slot in struct gpu_cu_table */
} gpu_dl_syms[] = {
	GPU_CU_FUNCS(GPU_DL_SYM)
};

/* Each slot is one plain function pointer, filled from a dlsym() void *. */
_Static_assert(sizeof(struct gpu_cu_table) ==
	       (0 GPU_CU_FUNCS(GPU_DL_COUNT)) * sizeof(void *),
	       "struct gpu_cu_table must be function pointers only");
_Static_assert(sizeof(gpu_cu.cuInit) == sizeof(void *),
	       "function and object pointers must have one size (POSIX)");

static struct {
	pthread_once_t once;	/* runs gpu_dl_open() */
	int ret;		/* its outcome: 0 or -ENODEV */
	char why[256];		/* dlerror() text when ret != 0 */
	atomic_bool loaded;	/* ret == 0, readable outside the once */
} gpu_dl = {
	.once = PTHREAD_ONCE_INIT,
	.ret = -ENODEV,
};

/* dlerror() text, or `fallback` when dlerror() has none. */
static void dl_why(const char *fallback)
{
	const char *e = dlerror();

	snprintf(gpu_dl.why, sizeof(gpu_dl.why), "%s", e ? e : fallback);
}

static void gpu_dl_open(void)
{
	struct gpu_cu_table t;
	void *h, *p;
	size_t i;

	h = dlopen(GPU_DL_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		dl_why("cannot be opened");
		return;
	}
	for (i = 0; i < sizeof(gpu_dl_syms) / sizeof(gpu_dl_syms[0]); i++) {
		dlerror();
		p = dlsym(h, gpu_dl_syms[i].name);
		if (!p) {
			dl_why(gpu_dl_syms[i].name);
			dlclose(h);
			return;
		}
		memcpy((char *)&t + gpu_dl_syms[i].off, &p, sizeof(p));
	}
	gpu_cu = t;
	gpu_dl.ret = 0;
	atomic_store(&gpu_dl.loaded, true);
}

/*
 * gpu_dl_load - load libcuda.so.1 and fill `gpu_cu`, once per process.
 * Returns 0, or -ENODEV with "no CUDA driver (libcuda.so.1: <dlerror>)"
 * written to msg when msg and msglen allow; a failure is final for the
 * process (nothing stays loaded, `gpu_cu` stays all NULL).
 */
int gpu_dl_load(char *msg, size_t msglen)
{
	pthread_once(&gpu_dl.once, gpu_dl_open);
	if (gpu_dl.ret && msg && msglen)
		snprintf(msg, msglen, "no CUDA driver (%s: %s)",
			 GPU_DL_LIBCUDA, gpu_dl.why);
	return gpu_dl.ret;
}

/* gpu_dl_loaded - true once gpu_dl_load() has succeeded; loads nothing. */
bool gpu_dl_loaded(void)
{
	return atomic_load(&gpu_dl.loaded);
}
