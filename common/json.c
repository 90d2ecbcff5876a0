/*
 * json.c - the JSON writer of the statistics (json.h).  The engine
 * (engine.c, gpu_tier.c) and the persistent tier (fs_persist.c) write
 * their parts of user.tierfs.stats through it; it calls nothing of theirs.
 *
 * Strings are escaped as JSON asks: a quote and a backslash get a
 * backslash, control characters (below 0x20) become \u00XX; other bytes,
 * UTF-8 included, are copied as they are (a path may hold any byte but
 * NUL and '/').
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

void json_init(struct json *j, char *buf, size_t len)
{
	*j = (struct json){ .buf = buf, .len = len };
	if (len)
		buf[0] = 0;
}

void json_init_inside(struct json *j, char *buf, size_t len)
{
	json_init(j, buf, len);
	j->depth = 1;
	j->more = 1u << 1;
}

int json_end(const struct json *j)
{
	return j->at >= j->len ? -ERANGE : (int)j->at;
}

static void put(struct json *j, const char *s, size_t n)
{
	if (j->at < j->len) {
		size_t room = j->len - j->at - 1;	/* and the NUL */
		size_t k = n < room ? n : room;

		memcpy(j->buf + j->at, s, k);
		j->buf[j->at + k] = 0;
	}
	j->at += n;
}

static void putf(struct json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void putf(struct json *j, const char *fmt, ...)
{
	char tmp[512];			/* a double's %.6f: 300-odd digits */
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		put(j, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void string(struct json *j, const char *s)
{
	const char *run = s;

	put(j, "\"", 1);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		char esc[8];

		if (ch != '"' && ch != '\\' && ch >= 0x20)
			continue;
		put(j, run, (size_t)(s - run));
		if (ch < 0x20)
			snprintf(esc, sizeof(esc), "\\u%04x", ch);
		else
			snprintf(esc, sizeof(esc), "\\%c", ch);
		put(j, esc, strlen(esc));
		run = s + 1;
	}
	put(j, run, (size_t)(s - run));
	put(j, "\"", 1);
}

/* The comma before a member (unless it is its container's first), its key. */
static void member(struct json *j, const char *key)
{
	uint32_t bit = 1u << (j->depth < JSON_DEPTH ? j->depth : JSON_DEPTH - 1);

	if (j->more & bit)
		put(j, ",", 1);
	j->more |= bit;
	if (key) {
		string(j, key);
		put(j, ":", 1);
	}
}

static void open_(struct json *j, const char *key, const char *brace)
{
	member(j, key);
	put(j, brace, 1);
	j->depth++;
	if (j->depth < JSON_DEPTH)
		j->more &= ~(1u << j->depth);
}

void json_obj(struct json *j, const char *key)
{
	open_(j, key, "{");
}

void json_arr(struct json *j, const char *key)
{
	open_(j, key, "[");
}

void json_close(struct json *j)
{
	put(j, "}", 1);
	if (j->depth)
		j->depth--;
}

void json_close_arr(struct json *j)
{
	put(j, "]", 1);
	if (j->depth)
		j->depth--;
}

void json_u64(struct json *j, const char *key, uint64_t v)
{
	member(j, key);
	putf(j, "%" PRIu64, v);
}

void json_int(struct json *j, const char *key, int64_t v)
{
	member(j, key);
	putf(j, "%" PRId64, v);
}

void json_num(struct json *j, const char *key, double v, int decimals)
{
	member(j, key);
	putf(j, "%.*f", decimals, v);
}

void json_bool(struct json *j, const char *key, bool v)
{
	member(j, key);
	put(j, v ? "true" : "false", v ? 4 : 5);
}

void json_str(struct json *j, const char *key, const char *s)
{
	member(j, key);
	string(j, s);
}
