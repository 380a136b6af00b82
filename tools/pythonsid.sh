#!/usr/bin/env bash
# A CPython 3.14 or 3.15 to test fastpool under, made from Debian's registry (PyPI carries no
# interpreters; Debian's sid has python3.14 and python3.15 with their test packages), then
# commands run in it.  VERSION is the interpreter's X.Y (3.14, 3.15: what CI runs; another
# that sid packages works the same way).
#
#   tools/pythonsid.sh VERSION root           make (or reuse) the root only (no compiler runs:
#                                             .ci/run starts both in the background early)
#   tools/pythonsid.sh VERSION setup          make (or reuse) the root and the venv, build the
#                                             compiled core, then exit
#   tools/pythonsid.sh VERSION run CMD...     run CMD in this checkout, under that venv
#   tools/pythonsid.sh VERSION pytest ARGS... the same as: run python -m pytest ARGS...
#   tools/pythonsid.sh VERSION why            exit 0 if it can work here, else say why, exit 3
#
# What it makes, once per VERSION, under $FASTPOOL_SID_CACHE/fastpool-pyXY (default
# /var/cache/fastpool-py314 and /var/cache/fastpool-py315, outside any checkout, so CI and
# every clone on this machine reuse them; each VERSION its own root, so that one that cannot
# be made, or whose package list changes, leaves the other alone):
#   root/        a `debootstrap --variant=minbase sid` root with pythonX.Y, pythonX.Y-dev,
#                pythonX.Y-venv, libpythonX.Y-testsuite (test.test_concurrent_futures,
#                test._test_multiprocessing) and gcc.  Keyed by ROOT_KEY below: a changed
#                package list makes a new root, nothing else does.
#   root/opt/fastpool-venv-KEY/   a venv with the build, runtime and test requirements
#                of pyproject.toml, keyed by their hash: a checkout whose requirements
#                changed rebuilds only the venv.  The compiled core is built in place on
#                every command (setuptools recompiles only what changed).
#   build.log    the last build of the compiled core; `setup` prints its compiler warnings
#                and their count ("N compiler warnings"), which .ci/pythonsid holds at 0.
# The checkout reaches the root as a bind mount at /src (read-write: the compiled core is
# built in place, as the README's install does; its files carry the cpython-3XY tag, so they
# sit beside the host interpreter's without touching them, and git ignores them).
#
# Everything comes from Debian's registry (debootstrap, apt) and from the package index pip
# is configured for on this host (its CA bundle and pip configuration are copied in; local
# wheel directories or file:// indexes that configuration names are bind-mounted read-only).
#
# Each command runs in a private mount namespace (unshare -m): /proc, /dev (with /dev/shm and
# /dev/pts: the tests' leak checks read the host's /dev/shm) and /sys with its cgroup mounts
# (--rbind: the OOM detection reads memory.events) are mounted there, unmounted when the
# command ends, and can never outlive it, even when it is killed.  One command at a time per
# VERSION's cache (flock); a second waits.
#
# Needs root and debootstrap (`apt-get update && apt-get install debootstrap`); without them
# it says so and exits 3, which .ci/run reports as "3.X not run" and goes on.
set -euo pipefail

say() { echo "pythonsid.sh${V:+ $V}: $*" >&2; }
V="${1:-}"
if ! [[ "$V" =~ ^3\.[0-9]+$ ]]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
shift
PY="python$V"
CACHE="${FASTPOOL_SID_CACHE:-/var/cache}/fastpool-py${V/./}"
MIRROR="${FASTPOOL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="$PY $PY-dev $PY-venv lib$PY-testsuite gcc ca-certificates"
ROOT_KEY="sid minbase 1: $PACKAGES"
CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOTFS="$CACHE/root"
UNAVAILABLE=3
DEBOOTSTRAP="${FASTPOOL_DEBOOTSTRAP:-$(command -v debootstrap || echo /usr/sbin/debootstrap)}"

unavailable() {
    say "$V unavailable: $*"
    exit "$UNAVAILABLE"
}

check_can() {
    [ "$(id -u)" -eq 0 ] || unavailable "needs root (debootstrap, chroot and mounts); run it as root"
    [ "$(uname -s)" = Linux ] || unavailable "needs Linux"
    command -v unshare >/dev/null || unavailable "needs unshare (util-linux)"
    if [ ! -f "$ROOTFS/.fastpool-root" ] || [ "$(cat "$ROOTFS/.fastpool-root")" != "$ROOT_KEY" ]; then
        [ -x "$DEBOOTSTRAP" ] ||
            unavailable "needs debootstrap: apt-get update && apt-get install -y debootstrap"
    fi
}

# ---- the root --------------------------------------------------------------------------

# Runs "$@" chrooted into $ROOTFS inside a fresh mount namespace with the mounts the tests
# need; the namespace, and so every mount, goes away with the command.
in_root() {
    local binds=() envs=() d kv
    for d in $(pip_local_dirs); do binds+=("$d"); done
    # the chroot's environment starts empty but for these: pip reads PIP_* as the host's does
    while IFS= read -r -d '' kv; do
        case "$kv" in PIP_*) envs+=("$kv") ;; esac
    done </proc/self/environ
    unshare --mount --propagation private -- /bin/bash -euo pipefail -c '
        R="$1"; C="$2"; shift 2
        binds=(); envs=()
        while [ "$1" != -- ]; do binds+=("$1"); shift; done; shift
        while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
        cleanup() {
            for b in "${binds[@]}"; do umount "$R$b" 2>/dev/null || true; done
            umount -R "$R/src" "$R/sys" "$R/dev" "$R/proc" 2>/dev/null || true
        }
        trap cleanup EXIT
        mount -t proc proc "$R/proc"
        mount --rbind /dev "$R/dev"
        mount --rbind /sys "$R/sys"
        mkdir -p "$R/src"
        mount --bind "$C" "$R/src"
        for b in "${binds[@]}"; do
            mkdir -p "$R$b"
            mount --bind "$b" "$R$b"
            mount -o remount,bind,ro "$R$b"
        done
        cp -L /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
        chroot "$R" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            "${envs[@]}" PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
    ' in_root "$ROOTFS" "$CHECKOUT" "${binds[@]}" -- "${envs[@]}" -- "$@"
}

# Directories that the host's pip configuration reads from (find-links, file:// indexes),
# so that pip inside sees the same index as pip outside.
pip_local_dirs() {
    {
        pip_config_files | xargs -r cat 2>/dev/null
        env | grep -E '^PIP_(FIND_LINKS|INDEX_URL|EXTRA_INDEX_URL)=' | cut -d= -f2-
    } | tr ' =' '\n\n' | sed -n -e 's#^file://##p' -e '\#^/#p' |
        while read -r p; do
            p="${p%/simple}"
            p="${p%/}"
            [ -d "$p" ] && echo "$p"
        done | sort -u
}

pip_config_files() {
    local f
    for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.pip/pip.conf" \
        "$HOME/.config/pip/pip.conf" ${PIP_CONFIG_FILE:-}; do
        [ -f "$f" ] && echo "$f"
    done
    return 0
}

# The host's CA bundle and pip configuration files (and the files they name, such as a
# constraints file), so that pip inside reaches the same index as pip outside.
copy_host_config() {
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        mkdir -p "$ROOTFS/etc/ssl/certs"
        cp -L /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
    fi
    local f dest named
    for f in $(pip_config_files); do
        case "$f" in
            "$HOME"/*) dest="$ROOTFS/root/${f#"$HOME"/}" ;;
            *) dest="$ROOTFS$f" ;;
        esac
        mkdir -p "$(dirname "$dest")"
        cp -L "$f" "$dest"
        for named in $(grep -Eo '/[^ ]+\.txt' "$f" || true); do
            if [ -f "$named" ]; then
                mkdir -p "$(dirname "$ROOTFS$named")"
                cp -L "$named" "$ROOTFS$named"
            fi
        done
    done
}

make_root() {
    if [ -f "$ROOTFS/.fastpool-root" ] && [ "$(cat "$ROOTFS/.fastpool-root")" = "$ROOT_KEY" ]; then
        return
    fi
    local t0=$SECONDS
    if [ ! -f "$ROOTFS/.fastpool-debootstrap" ]; then
        say "making a Debian sid root in $ROOTFS (debootstrap --variant=minbase)"
        rm -rf "$ROOTFS.partial" "$ROOTFS"
        "$DEBOOTSTRAP" --variant=minbase sid "$ROOTFS.partial" "$MIRROR" \
            >"$CACHE/debootstrap.log" 2>&1 ||
            unavailable "debootstrap failed (see $CACHE/debootstrap.log): $(tail -n 3 "$CACHE/debootstrap.log")"
        mv "$ROOTFS.partial" "$ROOTFS"
        touch "$ROOTFS/.fastpool-debootstrap"
    fi
    # the registry's sid Release file can be past its Valid-Until date
    cat >"$ROOTFS/etc/apt/apt.conf.d/99fastpool" <<'APT'
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
APT
    say "apt-get install $PACKAGES (in the root)"
    { in_root apt-get -q -o Acquire::Check-Valid-Until=false update &&
        in_root env DEBIAN_FRONTEND=noninteractive apt-get -y -q \
            -o Acquire::Check-Valid-Until=false install $PACKAGES &&
        in_root apt-get clean; } >"$CACHE/apt.log" 2>&1 ||
        unavailable "apt-get in the root failed (see $CACHE/apt.log): $(tail -n 3 "$CACHE/apt.log")"
    echo "$ROOT_KEY" >"$ROOTFS/.fastpool-root"
    say "root ready in $((SECONDS - t0)) s: $(in_root "$PY" --version)"
}

# What the venv holds: the build, runtime and test requirements pyproject.toml lists.  The
# venv is keyed by them alone; the compiled core is build_core's, redone on every change.
requirements() {
    in_root "$PY" -c '
import tomllib
t = tomllib.load(open("/src/pyproject.toml", "rb"))
print(*t["build-system"]["requires"], *t["project"]["dependencies"],
      *t["project"]["optional-dependencies"]["test"], sep="\n")'
}

make_venv() {
    copy_host_config
    local reqs
    reqs="$(requirements)"
    VENV="/opt/fastpool-venv-$(printf '%s\n' "$reqs" | sha256sum | cut -c1-16)"
    if [ -f "$ROOTFS$VENV/ready" ]; then
        return
    fi
    local t0=$SECONDS old
    for old in "$ROOTFS"/opt/fastpool-venv-*; do  # other requirements': one venv kept
        [ -d "$old" ] && rm -rf "$old"
    done
    say "making the $V venv $VENV (the build, runtime and test requirements)"
    printf '%s\n' "$reqs" >"$ROOTFS/tmp/fastpool-reqs.txt"
    # The requirements only (wheels; pip's cache stays in the root, so a new venv downloads
    # nothing again).  fastpool itself is not pip-installed: build_core compiles it once, in
    # place, with the Cython and NumPy installed here, and a .pth file puts /src on the
    # venv's path, as an editable install would (pip's editable build would compile it a
    # second time, in an isolated environment with its own Cython and NumPy downloaded).
    cat >"$ROOTFS/tmp/fastpool-venv.sh" <<'SH'
set -e
"$2" -m venv "$1"
"$1/bin/python" -m pip install -q -r /tmp/fastpool-reqs.txt
echo /src >"$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/fastpool-src.pth"
SH
    in_root env PIP_CACHE_DIR=/var/cache/fastpool-pip /bin/sh /tmp/fastpool-venv.sh "$VENV" "$PY" \
        >"$CACHE/pip.log" 2>&1 ||
        unavailable "pip install in the $V venv failed (see $CACHE/pip.log): $(tail -n 5 "$CACHE/pip.log")"
    touch "$ROOTFS$VENV/ready"
    say "venv ready in $((SECONDS - t0)) s"
}

# The compiled core for $V, in place; setuptools rebuilds only what changed, so the warnings
# counted are those of what this build compiled (every module in a fresh clone).
build_core() {
    in_root /bin/sh -ec "cd /src && $VENV/bin/python setup.py -q build_ext --inplace -j2" \
        >"$CACHE/build.log" 2>&1 ||
        { say "building the compiled core under $V failed:"; tail -n 30 "$CACHE/build.log" >&2; exit 1; }
}

# The compiler warnings of the last build (gcc's file:line:col: warning:), each with its
# source line, then their count.
build_warnings() {
    local n pattern='\.[ch]:[0-9]+:[0-9]+: warning:'
    n=$(grep -cE "$pattern" "$CACHE/build.log" || true)
    [ "$n" -eq 0 ] || grep -A 2 -E "$pattern" "$CACHE/build.log" | sed 's/^/    /' >&2
    echo "$n compiler warnings"
}

# The lock is held until this script ends, by `run` too: a command never sees a root or
# venv that another pythonsid.sh is still making.
lock_cache() {
    check_can
    mkdir -p "$CACHE"
    exec 9>"$CACHE/lock"
    if ! flock -n 9; then
        say "another pythonsid.sh $V holds $CACHE/lock; waiting"
        flock 9
    fi
}

setup() {
    lock_cache
    make_root
    make_venv
    build_core
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    why)
        check_can
        echo "pythonsid.sh: can make or reuse a $V root in $ROOTFS"
        ;;
    root)
        lock_cache
        make_root
        ;;
    setup)
        setup
        echo "pythonsid.sh: $(in_root "$VENV/bin/python" --version) ready, venv $ROOTFS$VENV;" \
            "the compiled core's build: $(build_warnings)"
        ;;
    run | pytest)
        setup
        [ "$cmd" = pytest ] && set -- python -m pytest "$@"
        [ $# -gt 0 ] || { say "run: which command?"; exit 2; }
        # the venv first on PATH; the tests' own children (python -m fastpool ...) find it
        in_root /bin/sh -c 'cd /src && export PATH="$0/bin:$PATH" VIRTUAL_ENV="$0" && exec "$@"' \
            "$VENV" "$@"
        ;;
    *)
        sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
