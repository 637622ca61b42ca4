# shellcheck shell=sh disable=SC2086,SC2154,SC2209
# SC2086: $TO/$FTO and stat fields are split on purpose
# SC2209: a plain word, not a command
# SC2154: set by the funnel that runs before this part (size, ino, fd_k, fd_d, fd_ju, fd_buf)
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
# What to follow: what the funnel read. Discovery's find replaces FW_LOG (a file: from the size the
# funnel read up to); a journal, docker or command source is followed as a stream (fw_sk, fw_sv).
fw_sk=; fw_sv=
case ${fd_k:-$FD_SRC} in
  journal|docker|command) fw_sk=${fd_k:-$FD_SRC}; fw_sv=${fd_d:-$FD_SRCV}; fw_off0=${size:-0} ;;
  file|slurm|cri)
    if [ -n "$fd_k" ]; then FW_LOG=$fd_d; fw_f=$fd_d; fw_off0=${size:-0}; fw_ino0=$ino; fi ;;
esac
# journalctl -n / docker logs --tail repeat the snapshot's last lines: the awk drops that overlap.
FW_HOLD=0; FW_SNAPTAIL=
case $fw_sk in
  journal|docker)
    if [ "$FW_SLINES" -gt 0 ] && [ -n "$fd_buf" ]; then
      FW_HOLD=$FW_SLINES; FW_SNAPTAIL=$(printf '%s\n' "$fd_buf" | tail -n "$FW_SLINES" | tail -c 65536)
    fi ;;
esac
export FW_LOG fw_f fw_off0 fw_ino0 fw_sk fw_sv fd_ju FW_HOLD FW_SNAPTAIL
exec 9<&0
"$fw_sh" -c "$FW_LOOP" 2>/dev/null | awk $fw_ai "$FW_AWK"
