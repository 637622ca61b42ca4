# shellcheck shell=sh disable=SC2034,SC2046,SC2086,SC3013
# SC2034: read by the part that runs after this one, or a placeholder
# SC2046: ls/stat fields are split on purpose
# SC2086: $TO/$FTO and stat fields are split on purpose
# SC3013: test -nt works in dash, bash, zsh and busybox ash
# Shared by the follower pre-stat and its loop shell (evaluated from FW_FUNCS).

fw_resolve() {
  fw_f=
  oifs=$IFS; IFS=''
  set -- $FW_LOG
  IFS=$oifs
  for c in "$@"; do
    [ -e "$c" ] || continue
    if [ -z "$fw_f" ] || [ "$c" -nt "$fw_f" ]; then fw_f=$c; fi
  done
  case $fw_f in -*) fw_f=./$fw_f ;; esac
}
fw_stat() {
  fw_size=; fw_mtime=; fw_ino=
  [ -n "$fw_f" ] || return 1
  if [ -n "$fw_nostat" ]; then
    [ -f "$fw_f" ] || return 1
    fw_size=$(wc -c <"$fw_f" 2>/dev/null | tr -d ' ')
    fw_mtime=$(date -r "$fw_f" +%s 2>/dev/null)
    set -- $(ls -di "$fw_f" 2>/dev/null)
    fw_ino=$1
  else
    set -- $(stat -L -c '%s %Y %i' "$fw_f" 2>/dev/null)
    [ $# -eq 3 ] || return 1
    fw_size=$1; fw_mtime=$2; fw_ino=$3
  fi
  [ -n "$fw_size" ]
}
