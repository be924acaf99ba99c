/*
 * test_version.c — the version the headers say is the version the library
 * says (butter_version()), and it is the MAJOR.MINOR.PATCH the macros hold.
 */
#include <stdio.h>
#include <string.h>

#include "butter/butter.h"
#include "check.h"

static void test_string_matches_macros(void)
{
	char want[32];

	snprintf(want, sizeof(want), "%d.%d.%d", BUTTER_VERSION_MAJOR, BUTTER_VERSION_MINOR,
		 BUTTER_VERSION_PATCH);
	CHECK(strcmp(BUTTER_VERSION_STRING, want) == 0);
	CHECK(strcmp(butter_version(), BUTTER_VERSION_STRING) == 0);
}

int main(void)
{
	RUN(test_string_matches_macros);
	return check_summary();
}
