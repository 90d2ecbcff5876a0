/*
 * json.h - a small append-only JSON writer for the statistics
 * (user.tierfs.stats): objects, arrays and members written in order into a
 * caller's buffer, commas placed by the writer, strings escaped.  No
 * allocation, no lock; one writer per buffer.
 *
 * A write that does not fit is counted, not written: json_end() then says
 * -ERANGE, as snprintf() would by its length.
 */
#ifndef TIERFS_JSON_H
#define TIERFS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH	16		/* nesting the writer follows */

struct json {
	char *buf;
	size_t len;			/* room in buf */
	size_t at;			/* bytes written, or that would have been */
	unsigned depth;			/* open objects and arrays */
	uint32_t more;			/* bit d: depth d has a member already */
};

/* An empty writer into buf[0..len). */
void json_init(struct json *j, char *buf, size_t len);
/* A writer that goes on inside an object that has members already (the
 * next member starts with a comma): for a fragment spliced into one. */
void json_init_inside(struct json *j, char *buf, size_t len);
/* The length written (buf NUL-terminated after it), or -ERANGE where
 * it did not fit (buf then holds a truncated, NUL-terminated prefix). */
int json_end(const struct json *j);

/* Members: key is NULL for a value of an array, or at the top. */
void json_obj(struct json *j, const char *key);	/* {, until json_close */
void json_arr(struct json *j, const char *key);	/* [, until json_close_arr */
void json_close(struct json *j);			/* } */
void json_close_arr(struct json *j);			/* ] */
void json_u64(struct json *j, const char *key, uint64_t v);
void json_int(struct json *j, const char *key, int64_t v);
void json_num(struct json *j, const char *key, double v, int decimals);	/* %.Nf */
void json_bool(struct json *j, const char *key, bool v);
void json_str(struct json *j, const char *key, const char *s);	/* escaped */

#endif
