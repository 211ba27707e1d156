# devicelab put: writes stdin to a file on the device, verifies it and commits it, in one round trip.
# The host sends this text inline (sh -c TEXT devicelab ARGS…) since it runs before any kit is on the
# device. POSIX sh: dash, bash, busybox, mksh, toybox (Android), macOS sh.
#
#   after|follow FILE SIZE [SHA FINAL MARKER MODE]
#     makes FILE's folder, writes stdin to FILE, checks that SIZE bytes landed (a full disk leaves a
#     short file: exit 28 with "short write" on stderr), prints the sha256 of FILE as written (read
#     back, not of the stream) and, when it equals SHA, commits: chmod MODE (if given), rename FILE to
#     FINAL, write SHA to MARKER.
#       after:  hash once the file is written, from the page cache (a device with few cores: a
#               concurrent hash competes with sshd's decryption for the same cores)
#       follow: hash while it is written: a follower reads the file itself in 16 MiB pieces as each
#               is complete (dd of the file rather than a tee of the stream: one copy fewer, and what
#               is hashed is what landed); it ends with the writer, or when this shell is gone
#   commit FILE - SHA FINAL MARKER MODE
#     only the commit step (for a file put and hashed some other way).

sha256() {
    if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r
    elif command -v sha256sum >/dev/null 2>&1; then sha256sum
    else shasum -a 256; fi
}

commit() {
    { [ -z "$6" ] || chmod "$6" "$1"; } && mv -f "$1" "$4" && printf '%s\n' "$3" > "$5"
}

short() {
    echo "short write: ${s:-?} of $2 bytes" >&2
    exit 28
}

how=$1
shift
if [ "$how" = commit ]; then
    commit "$@"
    exit
fi
d=${1%/*}
[ -z "$d" ] || mkdir -p "$d" || exit 1
# the follower reads pieces with dd; a userland without it (Debian's toybox build) hashes after
[ "$how" = follow ] && ! command -v dd >/dev/null 2>&1 && how=after
case $how in
after)
    cat > "$1" && s=$(($(wc -c < "$1"))) && [ "$s" -eq "$2" ] || short "$@"
    h=$(sha256 < "$1") || exit 1
    ;;
follow)
    : > "$1" && rm -f "$1.done" || exit 1
    p=1
    sleep 0.01 2>/dev/null && p=0.02
    {
        k=0
        while :; do
            if [ -e "$1.done" ]; then
                dd if="$1" bs=1048576 skip=$((k * 16)) 2>/dev/null
                break
            fi
            kill -0 $$ 2>/dev/null || exit 1
            if [ $(($(wc -c < "$1"))) -ge $(((k + 1) * 16777216)) ]; then
                dd if="$1" bs=1048576 skip=$((k * 16)) count=16 2>/dev/null
                k=$((k + 1))
            else
                sleep $p
            fi
        done
    } | sha256 > "$1.sha" &
    w=$!
    cat > "$1"
    rc=$?
    : > "$1.done"
    wait $w
    h=$(cat "$1.sha")
    rm -f "$1.done" "$1.sha"
    s=$(($(wc -c < "$1")))
    [ "$rc" -eq 0 ] && [ "$s" -eq "$2" ] || short "$@"
    ;;
*)
    echo "put.sh: unknown mode $how" >&2
    exit 2
    ;;
esac
h=${h%% *}
echo "$h"
[ -n "$4" ] && [ "$h" = "$3" ] || exit 0
commit "$@"
