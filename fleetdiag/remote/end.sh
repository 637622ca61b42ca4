# shellcheck shell=sh
echo "$FD_MARK end"
