#!/bin/sh
# HTCondor file transfer plugin for root:// URLs (single-file protocol: -classad,
# or SOURCE DEST). The cache comes from the environment the pilot gives its
# daemons; a job with `+WantXCache = false` reads from the origin.
set -eu
if [ "${1:-}" = -classad ]; then
    printf '%s\n' 'PluginVersion = "0.1"' 'PluginType = "FileTransfer"' 'SupportedMethods = "root"'
    exit 0
fi
[ $# -eq 2 ] || { echo "usage: $0 -classad | SOURCE DEST" >&2; exit 1; }
if [ -n "${_CONDOR_JOB_AD:-}" ] && grep -qix 'WantXCache = false' "$_CONDOR_JOB_AD" 2>/dev/null
then
    unset XRD_PLUGIN XROOT_PROXY XROOT_PROXY_EXCL_DOMAINS
fi
exec xrdcp --nopbar --force "$1" "$2"
