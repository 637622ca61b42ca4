# Shared awk functions, prepended to every remote awk program (FD_AWKLIB).
# fd_int: byte offsets as integers (mawk prints 1.07e+10 with plain print).
function fd_int(v) { return sprintf("%.0f", v) }
# fd_clip: a line over ML bytes keeps both ends around a marker (ML set in BEGIN).
function fd_clip(s,  h) {
  if (length(s) <= ML) return s
  h = int(ML / 2)
  return substr(s, 1, h) "...[fleetdiag: " (length(s) - 2 * h) " bytes cut]..." substr(s, length(s) - h + 1)
}
