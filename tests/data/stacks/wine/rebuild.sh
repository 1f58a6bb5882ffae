#!/bin/sh
# Rebuilds the Wine-oracle fixtures (tests/test_stacks_wine.py reads them; CI
# needs neither Wine nor the compilers): oracle.c built four ways, each run under
# Wine twice — the main thread parked while a second thread writes the minidump
# through dbghelp, and faulting into an exception filter that writes it — each run
# recording its true call chain.  Stored: the stripped images, the minidumps
# (gzip) and the chains.
#
# Needs: Debian's wine (wine64), mingw-w64 (x86_64-w64-mingw32-gcc) and clang.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export WINEPREFIX="$work/prefix" WINEDEBUG=-all
cd "$work"
cp "$here/oracle.c" .
build() {  # build NAME compiler flags...
    name=$1; shift
    case "$1" in
        gcc) shift; x86_64-w64-mingw32-gcc "$@" -c oracle.c -o "$name.o" ;;
        clang) shift; clang --target=x86_64-w64-mingw32 "$@" -c oracle.c -o "$name.o" ;;
    esac
    x86_64-w64-mingw32-gcc -s -o "oracle-$name.exe" "$name.o" -ldbghelp
}
build mingw-O0 gcc -O0
build mingw-O2 gcc -O2
build clang-O2 clang -O2
build clang-fp clang -O2 -fno-omit-frame-pointer
for name in mingw-O0 mingw-O2 clang-O2 clang-fp; do
    wine "./oracle-$name.exe"
    wine "./oracle-$name.exe" fault
    for run in "oracle-$name" "oracle-$name-fault"; do
        gzip -9 -n -c "$run.dmp" > "$here/$run.dmp.gz"
        cp "$run.chain" "$here/$run.chain"
    done
    cp "oracle-$name.exe" "$here/"
done
