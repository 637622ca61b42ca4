# shellcheck shell=sh disable=SC2086,SC2209
# SC2086: $TO/$FTO and stat fields are split on purpose
# SC2209: a plain word, not a command
# After the funnel: end stale followers, then the loop piped into one awk.

renice -n 19 -p $$ >/dev/null 2>&1
ionice -c3 -p $$ >/dev/null 2>&1
for p in $FW_KILL; do
  if [ -r "/proc/$p/cmdline" ] && tr '\000' ' ' <"/proc/$p/cmdline" | grep -q -e "$FW_IDTAG"; then
    kill -s TERM -- "-$p" 2>/dev/null || kill -s TERM "$p" 2>/dev/null
  fi
done
fw_sh=sh
[ "$FW_SHELL" != sh ] && command -v bash >/dev/null 2>&1 && fw_sh=bash
fw_ai=
awk -W interactive 'BEGIN { }' </dev/null >/dev/null 2>&1 && fw_ai='-W interactive'
exec 9<&0
"$fw_sh" -c "$FW_LOOP" 2>/dev/null | awk $fw_ai "$FW_AWK"
