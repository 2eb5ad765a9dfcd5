#!/usr/bin/env bash
# Makes sure Debian's Chromium is installed, for the dashboard's browser test (package
# ui, TestDashboardInBrowser, driven by chromedp), and prints the line that points the
# test at it:
#
#   eval "$(bash scripts/chromium.sh)"     # then: go test -run Browser ./ui/
#
# Debian 12 (bookworm) or later. It installs the Debian "chromium" package when no
# chromium is on PATH (apt-get update runs only then; that needs root) and checks that
# the binary starts. Progress goes to stderr; the only line on stdout is the export.
set -euo pipefail

log() { printf 'chromium.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v chromium >/dev/null; then
	[ "$(id -u)" -eq 0 ] || die "chromium is not installed; run as root to install it (sudo bash scripts/chromium.sh)"
	log "Chromium is not installed; installing the Debian package"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update >&2
	apt-get install -y --no-install-recommends chromium >&2
fi
BIN=$(command -v chromium) || die "apt-get installed chromium but it is not on PATH"
VERSION=$("$BIN" --headless --no-sandbox --version 2>/dev/null) || die "$BIN does not start"
log "$VERSION at $BIN"

printf 'export LEASEHOLD_TEST_CHROMIUM=%s\n' "$BIN"
