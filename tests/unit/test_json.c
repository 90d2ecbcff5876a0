/*
 * test_json.c - the statistics' JSON writer (common/json.c): commas,
 * nesting, string escaping, and -ERANGE with a NUL-terminated prefix when
 * the buffer is short.  Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

static int fails;

static void expect(const char *what, const char *got, int ret, const char *want)
{
	if (strcmp(got, want) || ret != (int)strlen(want)) {
		printf("FAIL %s:\n  got  %s (%d)\n  want %s\n", what, got, ret, want);
		fails++;
	}
}

int main(void)
{
	char buf[512], small[8];
	struct json j;
	int ret;

	json_init(&j, buf, sizeof(buf));
	json_obj(&j, NULL);
	json_obj(&j, "tiers");
	json_obj(&j, "host");
	json_u64(&j, "capacity", 18446744073709551615ull);
	json_bool(&j, "pinned", false);
	json_close(&j);
	json_close(&j);
	json_int(&j, "running", -3);
	json_num(&j, "bw", 1234.5678, 0);
	json_num(&j, "s", 0.25, 6);
	json_arr(&j, "links");
	json_obj(&j, NULL);
	json_arr(&j, "peer");
	json_num(&j, NULL, 0, 0);
	json_num(&j, NULL, 2, 0);
	json_close_arr(&j);
	json_close(&j);
	json_obj(&j, NULL);
	json_close(&j);
	json_close_arr(&j);
	json_str(&j, "dir", "/p \"q\\ \x01x\x7f\xc3\xa9");
	json_arr(&j, "none");
	json_close_arr(&j);
	json_close(&j);
	ret = json_end(&j);
	expect("document", buf, ret,
	       "{\"tiers\":{\"host\":{\"capacity\":18446744073709551615,\"pinned\":false}},"
	       "\"running\":-3,\"bw\":1235,\"s\":0.250000,\"links\":[{\"peer\":[0,2]},{}],"
	       "\"dir\":\"/p \\\"q\\\\ \\u0001x\x7f\xc3\xa9\",\"none\":[]}");

	json_init_inside(&j, buf, sizeof(buf));
	json_u64(&j, "mapped", 1);
	json_str(&j, "device", "x");
	ret = json_end(&j);
	expect("fragment", buf, ret, ",\"mapped\":1,\"device\":\"x\"");

	json_init(&j, small, sizeof(small));
	json_obj(&j, NULL);
	json_str(&j, "key", "value");
	json_close(&j);
	ret = json_end(&j);
	if (ret != -ERANGE || strcmp(small, "{\"key\":")) {
		printf("FAIL short buffer: %d '%s'\n", ret, small);
		fails++;
	}
	json_init(&j, NULL, 0);
	json_obj(&j, NULL);
	json_close(&j);
	if (json_end(&j) != -ERANGE || j.at != 2) {
		printf("FAIL no buffer: %d, %zu\n", json_end(&j), j.at);
		fails++;
	}
	printf("%s\n", fails ? "FAIL" : "PASS");
	return fails ? 1 : 0;
}
