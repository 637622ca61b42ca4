# shellcheck shell=sh
# Kernel evidence in the probe's round trip (after the funnel and the facts): kernel.sh's functions are defined
# above this; each line it prints travels as a K record, so no kernel line can pass for a funnel record.
if [ -n "$FD_KPATH" ]; then PATH=$FD_KPATH:$PATH; export PATH; fi
fd_kernel_main </dev/null 2>/dev/null | awk '{ print "K\t" $0 }'
