/*
 * fuzz_entry.h — the two functions libFuzzer calls in a harness: once at
 * start-up (optional) and once per input. Declared here so every harness
 * defines them against one prototype (-Wmissing-prototypes).
 */
#ifndef BUTTER_FUZZ_ENTRY_H
#define BUTTER_FUZZ_ENTRY_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
