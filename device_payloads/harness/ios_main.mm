// The iOS app around devicelab-harness (not compiled on Linux: it needs UIKit; built on the Mac with -G Xcode).
// `xcrun devicectl device process launch --console ... BUNDLE_ID ARGS...` starts the app with ARGS; the app
// chdirs to its data container (NSHomeDirectory(): Documents/ lives there), runs the harness's dispatch on a
// background thread (the main thread keeps UIKit's run loop) and exits with the command's status. The sampler's
// thermal state and battery come from here: ProcessInfo.thermalState (thread-safe) and UIDevice's battery, read
// on the main thread every second into atomics the sampler thread reads.

#import <Foundation/Foundation.h>
#import <UIKit/UIKit.h>

#include <os/proc.h>
#include <sys/sysctl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "platform.h"

static std::atomic<int> g_battery_pct{-1};
static std::atomic<int> g_battery_state{0};  // UIDeviceBatteryState
static std::string g_os, g_model;

static void read_battery(void) {  // main thread only
    UIDevice * d = [UIDevice currentDevice];
    float level = d.batteryLevel;  // -1 when unknown; 0.0 ... 1.0 in 1 % steps
    g_battery_pct = level < 0 ? -1 : (int) lroundf(level * 100.0f);
    g_battery_state = (int) d.batteryState;
}

extern "C" const char * devicelab_platform_name(void) {
    return "ios";
}

extern "C" void devicelab_platform_power(devicelab_power * out) {
    const char * thermal = "";
    switch ([[NSProcessInfo processInfo] thermalState]) {
        case NSProcessInfoThermalStateNominal: thermal = "nominal"; break;
        case NSProcessInfoThermalStateFair: thermal = "fair"; break;
        case NSProcessInfoThermalStateSerious: thermal = "serious"; break;
        case NSProcessInfoThermalStateCritical: thermal = "critical"; break;
    }
    strlcpy(out->thermal_state, thermal, sizeof(out->thermal_state));
    out->battery_level_pct = g_battery_pct.load();
    const char * state = "unknown";
    switch ((UIDeviceBatteryState) g_battery_state.load()) {
        case UIDeviceBatteryStateUnplugged: state = "unplugged"; break;
        case UIDeviceBatteryStateCharging: state = "charging"; break;
        case UIDeviceBatteryStateFull: state = "full"; break;
        default: state = "unknown"; break;
    }
    strlcpy(out->battery_state, state, sizeof(out->battery_state));
}

extern "C" long long devicelab_app_available_bytes(void) {
    return (long long) os_proc_available_memory();  // iOS 13+: what this app may still allocate before jetsam
}

extern "C" const char * devicelab_platform_os(void) {
    return g_os.c_str();
}

extern "C" const char * devicelab_platform_model(void) {
    return g_model.c_str();
}

@interface DevicelabAppDelegate : UIResponder <UIApplicationDelegate>
@property(strong, nonatomic) UIWindow * window;
@property(strong, nonatomic) NSTimer * batteryTimer;
@end

@implementation DevicelabAppDelegate

- (BOOL)application:(UIApplication *)application didFinishLaunchingWithOptions:(NSDictionary *)options {
    self.window = [[UIWindow alloc] initWithFrame:[[UIScreen mainScreen] bounds]];
    UIViewController * vc = [[UIViewController alloc] init];
    UILabel * label = [[UILabel alloc] initWithFrame:self.window.bounds];
    label.text = @"devicelab-harness: running";
    label.textAlignment = NSTextAlignmentCenter;
    vc.view = label;
    self.window.rootViewController = vc;
    [self.window makeKeyAndVisible];

    UIDevice * d = [UIDevice currentDevice];
    d.batteryMonitoringEnabled = YES;
    application.idleTimerDisabled = YES;  // a screen that locks suspends the app mid-measurement
    g_os = std::string("iOS ") + [d.systemVersion UTF8String];
    char machine[64] = "";
    size_t n = sizeof(machine);
    if (sysctlbyname("hw.machine", machine, &n, nullptr, 0) == 0) {
        g_model = machine;  // e.g. iPhone16,1
    }
    read_battery();
    self.batteryTimer = [NSTimer scheduledTimerWithTimeInterval:1.0
                                                        repeats:YES
                                                          block:^(NSTimer * t) {
                                                          (void) t;
                                                          read_battery();
                                                      }];

    chdir([NSHomeDirectory() fileSystemRepresentation]);
    NSArray<NSString *> * args = [[NSProcessInfo processInfo] arguments];
    NSThread * worker = [[NSThread alloc] initWithBlock:^{
        std::vector<std::string> keep;
        for (NSString * a in args) {
            keep.emplace_back([a UTF8String]);
        }
        std::vector<char *> argv;
        for (auto & s : keep) {
            argv.push_back(&s[0]);
        }
        argv.push_back(nullptr);
        int rc = devicelab_dispatch((int) keep.size(), argv.data());
        fflush(stdout);
        fflush(stderr);
        exit(rc);
    }];
    worker.stackSize = 16 << 20;  // llama.cpp's tools keep large objects on the stack
    [worker start];
    return YES;
}

@end

int main(int argc, char * argv[]) {
    @autoreleasepool {
        return UIApplicationMain(argc, argv, nil, NSStringFromClass([DevicelabAppDelegate class]));
    }
}
