# shellcheck shell=sh disable=SC2154
# SC2154: set by the part that runs before this one
# The log size and inode before the funnel reads it.

LC_ALL=C; export LC_ALL
eval "$FW_FUNCS"
fw_nostat=
stat -L -c '%s' / >/dev/null 2>&1 || fw_nostat=1
fw_resolve
fw_off0=0; fw_ino0=
if fw_stat; then fw_off0=$fw_size; fw_ino0=$fw_ino; fi
FW_SELF=$$
export fw_nostat fw_f fw_off0 fw_ino0 FW_SELF
