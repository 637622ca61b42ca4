# shellcheck shell=sh
# The begin marker of a script that runs no funnel (the kernel part alone: fleetdiag.probe.kernel_command).
echo "$FD_MARK begin"
