// devicelab-harness: llama.cpp's own tools in one executable (busybox-style dispatch on argv[1]), and the
// device-side services devicelab's scripts give on a device with a shell (run_payload.sh + sampler.sh, facts.sh,
// sha256, the put commit, tiny file operations), for a device without one: an iPhone. The same sources build for
// Linux, where the suite runs them. The contract is in CMakeLists.txt's header and the devicelab docs.
//
//   devicelab-harness TOOL ARGS...                      the tool itself (llama-bench, llama-perplexity, ...)
//   devicelab-harness tools                             the tools it carries, one per line
//   devicelab-harness run OUTDIR INTERVAL_MS ROOT -- TOOL ARGS...
//   devicelab-harness facts WORKDIR [ROOT]
//   devicelab-harness sha256 FILE
//   devicelab-harness commit TMP SHA DST MARKER
//   devicelab-harness fs mkdir|exists|rm|touch|cat PATH  |  fs cp SRC DST

#include "platform.h"
#include "sha256.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <strings.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <unistd.h>

#if defined(__APPLE__)
#    include <mach/mach.h>
#    include <sys/sysctl.h>
#endif

#ifndef DEVICELAB_HARNESS_VERSION
#    define DEVICELAB_HARNESS_VERSION "unknown"
#endif

// ---------------------------------------------------------------- the tools it carries
#define DEVICELAB_TOOL(name, fn) int fn(int, char **);
#include "devicelab_tools.inc"
#undef DEVICELAB_TOOL

namespace {

struct Tool {
    const char * name;
    int (*fn)(int, char **);
};

const Tool TOOLS[] = {
#define DEVICELAB_TOOL(name, fn) {name, fn},
#include "devicelab_tools.inc"
#undef DEVICELAB_TOOL
    {nullptr, nullptr},
};

const Tool * find_tool(const std::string & name) {
    for (const Tool * t = TOOLS; t->name; t++) {
        if (name == t->name) {
            return t;
        }
    }
    return nullptr;
}

std::string tool_list(const char * sep) {
    std::string out;
    for (const Tool * t = TOOLS; t->name; t++) {
        out += (out.empty() ? "" : sep);
        out += t->name;
    }
    return out;
}

// ---------------------------------------------------------------- small helpers
double mono_s() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

std::string base_name(const std::string & p) {
    size_t i = p.find_last_of('/');
    return i == std::string::npos ? p : p.substr(i + 1);
}

std::string parent_dir(const std::string & p) {
    size_t i = p.find_last_of('/');
    if (i == std::string::npos) {
        return "";
    }
    return i == 0 ? "/" : p.substr(0, i);
}

bool mkdir_p(const std::string & path) {
    if (path.empty()) {
        return true;
    }
    struct stat st{};
    if (stat(path.c_str(), &st) == 0) {
        return S_ISDIR(st.st_mode);
    }
    std::string up = parent_dir(path);
    if (!up.empty() && up != path && !mkdir_p(up)) {
        return false;
    }
    return mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
}

bool write_file(const std::string & path, const std::string & text, bool append = false) {
    FILE * f = fopen(path.c_str(), append ? "a" : "w");
    if (!f) {
        return false;
    }
    bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
    return fclose(f) == 0 && ok;
}

void write_all(int fd, const char * p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return;  // the console went away: the files still get everything
        }
        p += w;
        n -= (size_t) w;
    }
}

std::string read_text(const char * path) {
    std::string out;
    FILE * f = fopen(path, "r");
    if (!f) {
        return out;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        out.append(buf, n);
    }
    fclose(f);
    return out;
}

// the value after "KEY:" on the first line starting with KEY in text (trimmed), "" if none
std::string field(const std::string & text, const char * key) {
    size_t klen = strlen(key);
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) {
            end = text.size();
        }
        if (text.compare(pos, klen, key) == 0) {
            size_t c = text.find(':', pos);
            if (c != std::string::npos && c < end) {
                size_t a = text.find_first_not_of(" \t", c + 1);
                if (a == std::string::npos || a >= end) {
                    return "";
                }
                size_t b = text.find_last_not_of(" \t\r", end - 1);
                return text.substr(a, b - a + 1);
            }
        }
        pos = end + 1;
    }
    return "";
}

long long first_number(const std::string & s) {
    return s.empty() ? -1 : atoll(s.c_str());
}

// ---------------------------------------------------------------- memory and CPU time of this process
struct Mem {
    long long rss_kb = -1;  // Linux VmRSS; Apple: phys_footprint (what jetsam counts)
    long long hwm_kb = -1;  // Linux VmHWM; Apple: ledger_phys_footprint_peak
};

Mem read_mem() {
    Mem m;
#if defined(__APPLE__)
    task_vm_info_data_t vm{};
    mach_msg_type_number_t count = TASK_VM_INFO_COUNT;
    if (task_info(mach_task_self(), TASK_VM_INFO, (task_info_t) &vm, &count) == KERN_SUCCESS) {
        m.rss_kb = (long long) (vm.phys_footprint / 1024);
#    ifdef TASK_VM_INFO_REV3_COUNT
        if (count >= TASK_VM_INFO_REV3_COUNT && vm.ledger_phys_footprint_peak > 0) {
            m.hwm_kb = (long long) (vm.ledger_phys_footprint_peak / 1024);
        }
#    endif
    }
#else
    std::string st = read_text("/proc/self/status");
    m.rss_kb = first_number(field(st, "VmRSS"));
    m.hwm_kb = first_number(field(st, "VmHWM"));
#endif
    return m;
}

double cpu_time_s() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return (double) ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double) ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

// ---------------------------------------------------------------- `run`: the sampler thread
class Sampler {
  public:
    Sampler(FILE * f, int interval_ms) : f_(f), interval_ms_(interval_ms) {}

    void header(const std::string & root) {
        int pid = (int) getpid();
        fprintf(f_, "# devicelab-sampler v1 interval_ms=%d slow_interval_ms=1000 root=%s pid=%d\n", interval_ms_,
                root.c_str(), pid);
        fprintf(f_, "# harness devicelab-harness platform=%s\n", devicelab_platform_name());
        fprintf(f_, "# clock monotonic\n");
        fprintf(f_,
                "tick,t_s,harness/thermal_state,harness/battery_level_pct,harness/battery_state,harness/cpu_time_s,"
                "proc/%d/VmRSS_kB,proc/%d/VmHWM_kB\n",
                pid, pid);
        fflush(f_);
    }

    // the first tick here, before the tool starts: a thread that a loaded device schedules late would otherwise
    // take none before a short tool returned (a doctor's probe run once had its last tick only)
    void start() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            row();
        }
        th_ = std::thread([this] {
            std::unique_lock<std::mutex> lk(mu_);
            while (!cv_.wait_for(lk, std::chrono::milliseconds(interval_ms_), [this] { return stop_; })) {
                row();
            }
        });
    }

    // stops the thread and takes the last tick (after the tool returned)
    void finish() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (th_.joinable()) {
            th_.join();
        }
        row();
        fclose(f_);
    }

  private:
    void row() {
        devicelab_power pw{};
        pw.battery_level_pct = -1;
        devicelab_platform_power(&pw);
        Mem m = read_mem();
        if (m.rss_kb > peak_kb_) {
            peak_kb_ = m.rss_kb;
        }
        if (m.hwm_kb < 0 && peak_kb_ >= 0) {
            m.hwm_kb = peak_kb_;  // no kernel high-water mark: the highest this sampler saw
        }
        char level[16] = "";
        if (pw.battery_level_pct >= 0) {
            snprintf(level, sizeof(level), "%d", pw.battery_level_pct);
        }
        char rss[32] = "", hwm[32] = "";
        if (m.rss_kb >= 0) {
            snprintf(rss, sizeof(rss), "%lld", m.rss_kb);
        }
        if (m.hwm_kb >= 0) {
            snprintf(hwm, sizeof(hwm), "%lld", m.hwm_kb);
        }
        fprintf(f_, "%ld,%.3f,%s,%s,%s,%.3f,%s,%s\n", tick_++, mono_s(), pw.thermal_state, level, pw.battery_state,
                cpu_time_s(), rss, hwm);
        fflush(f_);
    }

    FILE * f_;
    int interval_ms_;
    long tick_ = 0;
    long long peak_kb_ = -1;
    bool stop_ = false;
    std::mutex mu_;
    std::condition_variable cv_;
    std::thread th_;
};

// ---------------------------------------------------------------- `run`: the tool's output, captured and teed
class Capture {
  public:
    bool start(const std::string & outdir) {
        tsv_ = fopen((outdir + "/stdout.tsv").c_str(), "w");
        err_fd_ = open((outdir + "/stderr.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int po[2], pe[2];
        if (!tsv_ || err_fd_ < 0 || pipe(po) != 0 || pipe(pe) != 0) {
            return false;
        }
        fflush(stdout);
        fflush(stderr);
        orig_out_ = dup(1);
        orig_err_ = dup(2);
        for (int fd : {orig_out_, orig_err_, po[0], pe[0]}) {
            fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[1]);
        close(pe[1]);
        out_r_ = po[0];
        err_r_ = pe[0];
        setvbuf(stdout, nullptr, _IOLBF, 0);  // each line leaves when printed: its arrival time is its time
        th_ = std::thread([this] { pump(); });
        return true;
    }

    // the tool is done: give fds 1 and 2 back (closing the pipes' write ends), drain what is left
    void finish() {
        fflush(stdout);
        fflush(stderr);
        dup2(orig_out_, 1);
        dup2(orig_err_, 2);
        {
            // a thread or child the tool left behind may still hold the pipe: wait a little, then stop reading
            std::unique_lock<std::mutex> lk(mu_);
            if (!cv_.wait_for(lk, std::chrono::seconds(3), [this] { return done_; })) {
                abandon_ = true;
            }
        }
        if (th_.joinable()) {
            th_.join();
        }
        fclose(tsv_);
        close(err_fd_);
        close(orig_out_);
        close(orig_err_);
    }

  private:
    void line_out(const char * p, size_t n, double t) {
        fprintf(tsv_, "%.3f\t", t);
        fwrite(p, 1, n, tsv_);
        fputc('\n', tsv_);
    }

    void pump() {
        std::string pending;
        bool out_open = true, err_open = true;
        char buf[65536];
        while ((out_open || err_open) && !abandon_) {
            pollfd fds[2];
            int n = 0;
            if (out_open) {
                fds[n++] = {out_r_, POLLIN, 0};
            }
            if (err_open) {
                fds[n++] = {err_r_, POLLIN, 0};
            }
            int r = poll(fds, (nfds_t) n, 100);
            if (r < 0 && errno != EINTR) {
                break;
            }
            for (int i = 0; i < n && r > 0; i++) {
                if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                    continue;
                }
                ssize_t got = read(fds[i].fd, buf, sizeof(buf));
                if (got < 0 && errno == EINTR) {
                    continue;
                }
                bool is_out = fds[i].fd == out_r_;
                if (got <= 0) {
                    (is_out ? out_open : err_open) = false;
                    continue;
                }
                if (is_out) {
                    double t = mono_s();
                    pending.append(buf, (size_t) got);
                    size_t start = 0, nl;
                    while ((nl = pending.find('\n', start)) != std::string::npos) {
                        line_out(pending.data() + start, nl - start, t);
                        start = nl + 1;
                    }
                    pending.erase(0, start);
                    fflush(tsv_);
                    write_all(orig_out_, buf, (size_t) got);
                } else {
                    write_all(err_fd_, buf, (size_t) got);
                    write_all(orig_err_, buf, (size_t) got);
                }
            }
        }
        if (!pending.empty()) {
            line_out(pending.data(), pending.size(), mono_s());
        }
        fflush(tsv_);
        close(out_r_);
        close(err_r_);
        {
            std::lock_guard<std::mutex> lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
    }

    FILE * tsv_ = nullptr;
    int err_fd_ = -1, orig_out_ = -1, orig_err_ = -1, out_r_ = -1, err_r_ = -1;
    std::thread th_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::atomic<bool> abandon_{false};
};

struct Run {
    std::string outdir;
    Capture capture;
    Sampler * sampler = nullptr;
};

Run * g_run = nullptr;
std::atomic<bool> g_finished{false};

// the end of a run, however the tool ended (returned, or called exit()): once
void finish_run(int status) {
    if (!g_run || g_finished.exchange(true)) {
        return;
    }
    Run & r = *g_run;
    r.capture.finish();
    r.sampler->finish();
    char buf[128];
    snprintf(buf, sizeof(buf), "end_s=%.3f\nend_epoch=%ld\n", mono_s(), (long) time(nullptr));
    write_file(r.outdir + "/clock", buf, true);
    snprintf(buf, sizeof(buf), "%d\n", status & 0xff);
    write_file(r.outdir + "/exit_code", buf);  // last: its presence says the run is complete
}

// SIGTERM / SIGINT before the tool has its own handler (or a tool without one): the run still ends with its
// files complete and exit_code 128+signal, as run_payload.sh writes for a payload it saw killed. The handler
// only writes the signal's number to a pipe (async-signal-safe); a thread finishes the run from there.
int g_sig_pipe[2] = {-1, -1};

void on_signal(int sig) {
    unsigned char b = (unsigned char) sig;
    ssize_t w = write(g_sig_pipe[1], &b, 1);
    (void) w;
}

void catch_stop_signals() {
    if (pipe(g_sig_pipe) != 0) {
        return;
    }
    fcntl(g_sig_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(g_sig_pipe[1], F_SETFD, FD_CLOEXEC);
    std::thread([] {
        unsigned char b = 0;
        ssize_t n;
        while ((n = read(g_sig_pipe[0], &b, 1)) < 0 && errno == EINTR) {
        }
        if (n == 1) {
            finish_run(128 + b);
            _exit(128 + b);
        }
    }).detach();
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
        struct sigaction old{};
        sigaction(sig, nullptr, &old);
        if (old.sa_handler == SIG_IGN) {
            continue;  // ignored when we were started (a background job's SIGINT): stays ignored
        }
        struct sigaction sa{};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, nullptr);
    }
}

int run_tool(int argc, char ** argv) {
    const Tool * t = find_tool(base_name(argv[0]));
    if (!t) {
        fprintf(stderr, "devicelab-harness: unknown tool %s; carried: %s\n", argv[0], tool_list(", ").c_str());
        return 127;
    }
    return t->fn(argc, argv);
}

int cmd_run(int argc, char ** argv) {
    // run OUTDIR INTERVAL_MS ROOT [--] TOOL ARGS...
    if (argc < 5) {
        fprintf(stderr, "usage: devicelab-harness run OUTDIR INTERVAL_MS ROOT -- TOOL ARGS...\n");
        return 2;
    }
    std::string outdir = argv[1];
    int interval = atoi(argv[2]);
    std::string root = argv[3];
    int i = 4;
    if (strcmp(argv[i], "--") == 0) {
        i++;
    }
    if (i >= argc || interval <= 0) {
        fprintf(stderr, "usage: devicelab-harness run OUTDIR INTERVAL_MS(>0) ROOT -- TOOL ARGS...\n");
        return 2;
    }
    if (!mkdir_p(outdir)) {
        fprintf(stderr, "devicelab-harness: cannot make %s: %s\n", outdir.c_str(), strerror(errno));
        return 125;
    }
    signal(SIGPIPE, SIG_IGN);  // a console that went away must not end the run
    char buf[128];
    snprintf(buf, sizeof(buf), "start_s=%.3f\nstart_epoch=%ld\n", mono_s(), (long) time(nullptr));
    write_file(outdir + "/clock", buf);
    int pid = (int) getpid();
    snprintf(buf, sizeof(buf), "runner=%d payload=%d sampler=%d\n", pid, pid, pid);
    write_file(outdir + "/pids", buf);
    FILE * tel = fopen((outdir + "/telemetry.csv").c_str(), "w");
    if (!tel) {
        fprintf(stderr, "devicelab-harness: cannot write %s/telemetry.csv: %s\n", outdir.c_str(), strerror(errno));
        return 125;
    }
    static Run run;  // lives until exit: exit() may finish it from inside the tool
    static Sampler sampler(tel, interval);
    run.outdir = outdir;
    run.sampler = &sampler;
    sampler.header(root);
    if (!run.capture.start(outdir)) {
        fprintf(stderr, "devicelab-harness: cannot capture output into %s: %s\n", outdir.c_str(), strerror(errno));
        return 125;
    }
    g_run = &run;
    catch_stop_signals();
    sampler.start();
    int rc = run_tool(argc - i, argv + i);
    finish_run(rc);
    return rc;
}

// ---------------------------------------------------------------- facts
void kv(const char * k, const std::string & v) {
    printf("%s=%s\n", k, v.c_str());
}

#if defined(__APPLE__)
std::string sysctl_str(const char * name) {
    char buf[256] = "";
    size_t n = sizeof(buf);
    if (sysctlbyname(name, buf, &n, nullptr, 0) != 0) {
        return "";
    }
    return std::string(buf, strnlen(buf, sizeof(buf)));
}

long long sysctl_ll(const char * name) {
    int64_t v = 0;
    size_t n = sizeof(v);
    return sysctlbyname(name, &v, &n, nullptr, 0) == 0 ? (long long) v : -1;
}
#endif

int cmd_facts(int argc, char ** argv) {
    std::string wd = argc > 1 ? argv[1] : ".";
    utsname u{};
    uname(&u);
    kv("uname", std::string(u.sysname) + " " + u.release + " " + u.machine);
    kv("arch", u.machine);
    kv("hostname", u.nodename);
    const char * os = devicelab_platform_os();
    const char * model = devicelab_platform_model();
    long long total_kb = -1, avail_kb = -1;
#if defined(__APPLE__)
    kv("os", os ? os : ("macOS " + sysctl_str("kern.osproductversion")));
    std::string brand = sysctl_str("machdep.cpu.brand_string");
    kv("cpu.model", model ? model : (brand.empty() ? sysctl_str("hw.machine") : brand));
    long long bytes = sysctl_ll("hw.memsize");
    total_kb = bytes > 0 ? bytes / 1024 : -1;
    vm_statistics64_data_t vs{};
    mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
    vm_size_t page = 0;
    host_page_size(mach_host_self(), &page);
    if (host_statistics64(mach_host_self(), HOST_VM_INFO64, (host_info64_t) &vs, &count) == KERN_SUCCESS) {
        avail_kb = (long long) ((vs.free_count + vs.inactive_count + vs.purgeable_count) * (uint64_t) page / 1024);
    }
#else
    std::string rel = read_text("/etc/os-release");
    std::string pretty;
    size_t p = rel.find("PRETTY_NAME=");
    if (p != std::string::npos) {
        size_t e = rel.find('\n', p);
        pretty = rel.substr(p + 12, e == std::string::npos ? std::string::npos : e - p - 12);
        if (pretty.size() >= 2 && (pretty[0] == '"' || pretty[0] == '\'')) {
            pretty = pretty.substr(1, pretty.size() - 2);
        }
    }
    kv("os", os ? os : pretty);
    std::string cpu = read_text("/proc/cpuinfo");
    std::string m = field(cpu, "model name");
    if (m.empty()) {
        m = field(cpu, "Hardware");
    }
    if (m.empty()) {
        m = field(cpu, "cpu model");
    }
    kv("cpu.model", model ? model : m);
    std::string feats = field(cpu, "flags");
    kv("cpu.features", feats.empty() ? field(cpu, "Features") : feats);
    std::string mi = read_text("/proc/meminfo");
    total_kb = first_number(field(mi, "MemTotal"));
    avail_kb = first_number(field(mi, "MemAvailable"));
#endif
    kv("cpu.count", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
    if (total_kb >= 0) {
        kv("mem.total_kB", std::to_string(total_kb));
    }
    if (avail_kb >= 0) {
        kv("mem.available_kB", std::to_string(avail_kb));
    }
    long long app = devicelab_app_available_bytes();
    if (app >= 0) {
        kv("mem.app_available_bytes", std::to_string(app));
    }
    mkdir_p(wd);
    struct statvfs sv{};
    kv("storage.free_kB",
       statvfs(wd.c_str(), &sv) == 0 ? std::to_string((unsigned long long) sv.f_bavail * sv.f_frsize / 1024) : "");
    kv("harness.tools", tool_list(","));
    kv("harness.version", DEVICELAB_HARNESS_VERSION);
    kv("harness.platform", devicelab_platform_name());
    return 0;
}

// ---------------------------------------------------------------- sha256, commit, fs
int cmd_sha256(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: devicelab-harness sha256 FILE\n");
        return 2;
    }
    std::string h = devicelab::sha256_file(argv[1]);
    if (h.empty()) {
        fprintf(stderr, "devicelab-harness: cannot read %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    printf("%s  %s\n", h.c_str(), argv[1]);
    return 0;
}

int cmd_commit(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: devicelab-harness commit TMP SHA DST MARKER\n");
        return 2;
    }
    const char *tmp = argv[1], *want = argv[2], *dst = argv[3], *marker = argv[4];
    std::string got = devicelab::sha256_file(tmp);
    if (got.empty() || strcasecmp(got.c_str(), want) != 0) {
        fprintf(stderr, "devicelab-harness: %s: sha256 %s, expected %s; kept for a retry\n", tmp,
                got.empty() ? "unreadable" : got.c_str(), want);
        return 3;
    }
    if (!mkdir_p(parent_dir(dst)) || rename(tmp, dst) != 0) {
        fprintf(stderr, "devicelab-harness: cannot move %s to %s: %s\n", tmp, dst, strerror(errno));
        return 1;
    }
    if (!mkdir_p(parent_dir(marker)) || !write_file(marker, "")) {
        fprintf(stderr, "devicelab-harness: cannot write %s: %s\n", marker, strerror(errno));
        return 1;
    }
    return 0;
}

bool rm_rf(const std::string & path) {
    struct stat st{};
    if (lstat(path.c_str(), &st) != 0) {
        return errno == ENOENT;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR * d = opendir(path.c_str());
        if (!d) {
            return false;
        }
        bool ok = true;
        while (dirent * e = readdir(d)) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                ok = rm_rf(path + "/" + e->d_name) && ok;
            }
        }
        closedir(d);
        return rmdir(path.c_str()) == 0 && ok;
    }
    return unlink(path.c_str()) == 0;
}

bool copy_file(const char * src, const std::string & dst) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0 || !mkdir_p(parent_dir(dst))) {
        if (in >= 0) {
            close(in);
        }
        return false;
    }
    std::string tmp = dst + ".devicelab-cp";
    int out = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = out >= 0;
    static char buf[1 << 20];
    ssize_t n;
    while (ok && (n = read(in, buf, sizeof(buf))) != 0) {
        if (n < 0) {
            ok = errno == EINTR;
            continue;
        }
        for (ssize_t off = 0; ok && off < n;) {
            ssize_t w = write(out, buf + off, (size_t) (n - off));
            ok = w > 0 || (w < 0 && errno == EINTR);
            off += w > 0 ? w : 0;
        }
    }
    close(in);
    if (out >= 0) {
        ok = close(out) == 0 && ok;
    }
    ok = ok && rename(tmp.c_str(), dst.c_str()) == 0;
    if (!ok) {
        unlink(tmp.c_str());
    }
    return ok;
}

int cmd_fs(int argc, char ** argv) {
    const char * usage = "usage: devicelab-harness fs mkdir|exists|rm|touch|cat PATH | fs cp SRC DST\n";
    if (argc < 3) {
        fputs(usage, stderr);
        return 2;
    }
    std::string op = argv[1];
    const char * path = argv[2];
    bool ok = false;
    if (op == "cp" && argc == 4) {
        ok = copy_file(path, argv[3]);
    } else if (argc != 3) {
        fputs(usage, stderr);
        return 2;
    } else if (op == "exists") {
        struct stat st{};
        return stat(path, &st) == 0 ? 0 : 1;
    } else if (op == "mkdir") {
        ok = mkdir_p(path);
    } else if (op == "rm") {
        ok = rm_rf(path);
    } else if (op == "touch") {
        int fd = mkdir_p(parent_dir(path)) ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
        ok = fd >= 0 && futimes(fd, nullptr) == 0;
        if (fd >= 0) {
            close(fd);
        }
    } else if (op == "cat") {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ok = fd >= 0;
        char buf[65536];
        ssize_t n;
        while (ok && (n = read(fd, buf, sizeof(buf))) != 0) {
            if (n < 0) {
                ok = errno == EINTR;
                continue;
            }
            write_all(1, buf, (size_t) n);
        }
        if (fd >= 0) {
            close(fd);
        }
    } else {
        fputs(usage, stderr);
        return 2;
    }
    if (!ok) {
        fprintf(stderr, "devicelab-harness: fs %s %s: %s\n", op.c_str(), path, strerror(errno));
        return 1;
    }
    return 0;
}

int usage(const char * what) {
    if (what) {
        fprintf(stderr, "devicelab-harness: unknown command %s\n", what);
    }
    fprintf(stderr,
            "usage: devicelab-harness TOOL ARGS... | tools | run OUTDIR INTERVAL_MS ROOT -- TOOL ARGS... | "
            "facts WORKDIR [ROOT] | sha256 FILE | commit TMP SHA DST MARKER | fs OP PATH...\n"
            "tools: %s\n",
            tool_list(", ").c_str());
    return 2;
}

}  // namespace

// ---------------------------------------------------------------- entry points
extern "C" void devicelab_before_exit(int status) {
    finish_run(status);
}

extern "C" int devicelab_dispatch(int argc, char ** argv) {
    // busybox-style: a link named after a tool runs the tool
    if (argc >= 1 && find_tool(base_name(argv[0]))) {
        return run_tool(argc, argv);
    }
    if (argc < 2) {
        return usage(nullptr);
    }
    std::string cmd = argv[1];
    if (find_tool(cmd)) {
        return run_tool(argc - 1, argv + 1);
    }
    if (cmd == "tools") {
        for (const Tool * t = TOOLS; t->name; t++) {
            printf("%s\n", t->name);
        }
        return 0;
    }
    if (cmd == "run") {
        return cmd_run(argc - 1, argv + 1);
    }
    if (cmd == "facts") {
        return cmd_facts(argc - 1, argv + 1);
    }
    if (cmd == "sha256") {
        return cmd_sha256(argc - 1, argv + 1);
    }
    if (cmd == "commit") {
        return cmd_commit(argc - 1, argv + 1);
    }
    if (cmd == "fs") {
        return cmd_fs(argc - 1, argv + 1);
    }
    if (cmd == "version" || cmd == "--version") {
        printf("%s\n", DEVICELAB_HARNESS_VERSION);
        return 0;
    }
    return usage(argv[1]);
}

#if !defined(DEVICELAB_IOS_APP)
// Linux (and a plain macOS build): no battery or thermal state the harness reads itself (the sampler's sysfs
// sources do that on Linux devices); no per-app memory limit.
extern "C" const char * devicelab_platform_name(void) {
#    if defined(__APPLE__)
    return "macos";
#    else
    return "linux";
#    endif
}

extern "C" void devicelab_platform_power(devicelab_power * out) {
    out->thermal_state[0] = '\0';
    out->battery_level_pct = -1;
    out->battery_state[0] = '\0';
}

extern "C" long long devicelab_app_available_bytes(void) {
    return -1;
}

extern "C" const char * devicelab_platform_os(void) {
    return nullptr;
}

extern "C" const char * devicelab_platform_model(void) {
    return nullptr;
}

int main(int argc, char ** argv) {
    return devicelab_dispatch(argc, argv);
}
#endif
