// Which device profile (llmc/device_profile.h) a step's time is predicted on, when the user names
// none: one rule for dev/memory_planner and the trainers' end-of-run line (llmc/run.h).
//   - a name or a file given (-profile): that one; a bad one is refused, with the field named;
//   - a CUDA device: the built-in profile of its kind, by the device's name (an H200: h200; an
//     A100: a100-80gb; any other: h100-sxm, the planner's default for -device cuda);
//   - the CPU: this machine's profile as dev/bench/calibrate measured it, looked for beside the
//     program (dev/profiles/cpu-this-machine.txt from the repository's root, where the trainers
//     are built; profiles/... beside dev/memory_planner). None there is not an error: the caller
//     prints profile_missing_hint's line instead of a prediction.
#ifndef LLMC_PROFILE_DEFAULT_H
#define LLMC_PROFILE_DEFAULT_H

#include <stdio.h>
#include <string.h>
#include "device_profile.h"

// where the CPU's measured profile is written (dev/bench/calibrate -o), from the repository's root
#define PROFILE_CPU_FILE "dev/profiles/cpu-this-machine.txt"

// what to do when the CPU has no profile: the one line the planner and the trainers print
static inline const char* profile_missing_hint(void) {
    return "no profile of this machine to predict it on (make one: mpirun -np 2 dev/bench/calibrate -o " PROFILE_CPU_FILE
           ", or give -profile h100-sxm, h200, a100-80gb or a file)";
}

// the built-in profile of a CUDA device, by the name its driver reports ("NVIDIA H200", ...)
static inline const char* profile_for_device_name(const char* device_name) {
    if (device_name && strstr(device_name, "H200")) return "h200";
    if (device_name && strstr(device_name, "A100")) return "a100-80gb";
    return "h100-sxm";
}

// Loads the profile into p and names it in label. asked: -profile's value (NULL: not given).
// device_name: the CUDA device's name (NULL or "" on the CPU, or where no device is at hand: the
// planner's -device cuda takes h100-sxm). program: the program's path, and beside: the CPU
// profile's path from the program's directory. Returns 1 when loaded, 0 when the CPU has no
// profile (label then says where it was looked for), -1 when the asked one, or the CPU's file
// found, is refused (why filled: "<name or file>:<line>: <field>: what is wrong").
static inline int profile_load_default(const char* asked, int cuda, const char* device_name, const char* program,
                                       const char* beside, DeviceProfile* p, char* label, size_t label_cap, char* why,
                                       size_t why_cap) {
    if (asked != NULL) {
        if (!device_profile_load(asked, p, why, why_cap)) return -1;
        snprintf(label, label_cap, "%s", asked);
        return 1;
    }
    if (cuda) {
        const char* name = profile_for_device_name(device_name);
        if (!device_profile_load(name, p, why, why_cap)) return -1;  // (a built-in: always parses)
        snprintf(label, label_cap, "%s", name);
        return 1;
    }
    // the program's directory, then beside: "dev/memory_planner" + "profiles/..."
    const char* slash = strrchr(program, '/');
    snprintf(label, label_cap, "%.*s%s", slash ? (int)(slash - program + 1) : 0, program, beside);
    FILE* f = fopen(label, "r");
    if (f == NULL) return 0;  // none measured yet
    fclose(f);
    return device_profile_load(label, p, why, why_cap) ? 1 : -1;  // (one there but broken: refused)
}

#endif  // LLMC_PROFILE_DEFAULT_H
