// What the harness asks of the platform it runs on. harness.cpp has the Linux (and plain macOS) answers; on iOS
// ios_main.mm gives them (UIKit and Foundation), with DEVICELAB_IOS_APP defined.
#pragma once

#include <cstddef>

struct devicelab_power {
    char thermal_state[16];  // nominal | fair | serious | critical; "" when unknown
    int battery_level_pct;   // 0..100 in 1 % steps; -1 when unknown
    char battery_state[16];  // unplugged | charging | full | unknown; "" when unknown
};

extern "C" {
const char * devicelab_platform_name(void);         // "ios" | "linux" | "macos"
void devicelab_platform_power(devicelab_power * out); // thread-safe; called by the sampler thread
long long devicelab_app_available_bytes(void);       // iOS: os_proc_available_memory(); -1 elsewhere
const char * devicelab_platform_os(void);            // e.g. "iOS 17.5"; nullptr: the harness finds it itself
const char * devicelab_platform_model(void);         // e.g. "iPhone16,1"; nullptr: the harness finds it itself
int devicelab_dispatch(int argc, char ** argv);      // harness.cpp: the whole command line, argv[0] = program
}
