# The follower filter (FW_AWK); fd_clip and fd_int come from lib.awk.
  function emit(p, n, t) { buf = buf "L\t" fd_int(p) "\t" n "\t" t "\n" }
  function emit_tail(p, n, t) { buf = buf "l\t" fd_int(p) "\t" n "\t" t "\n" }
  function batch_end(force,   k, s, j) {
    if (!force && nr == 0 && buf == "" && dropped == 0) return
    s = (nr > TN) ? nr - TN : 0
    for (k = s; k < nr; k++) { j = k % TN; if (!rk[j]) emit_tail(rp[j], rn[j], rt[j]) }
    if (dropped > 0) buf = buf "X\tfollow: " dropped " more error-shaped lines in one burst not shown\n"
    printf "%sS\t%.0f\n", buf, pos; fflush()
    buf = ""; nb = 0; nr = 0; dropped = 0; seenw = 0; seenr = 0; split("", rk)
  }
  function show_partial(   t) { if (pend != "") { t = pend; sub(/\r$/, "", t); emit_tail(pos, (ln >= 0) ? ln + 1 : "-", fd_clip(t)) } }
  function line(t,   p, n, tagged, g, keep, j) {
    p = pos; pos += length(t) + 1
    if (ln >= 0) { ln++; n = ln } else n = "-"
    sub(/\r$/, "", t); t = fd_clip(t)
    keep = 0
    if (rs != "" && t ~ rs) { split("", ctx); prevk = 0; keep = 1 }
    tagged = (tg != "" && match(t, tg)); g = tagged ? substr(t, RSTART, RLENGTH) : ""
    if (kw != "" && t ~ kw) { keep = 1; if (ctx[g] + 0 <= 0) ctx[g] = C }
    else if (ctx[g] + 0 > 0) keep = 1
    else if (!tagged && prevk) keep = 1
    if (keep && ctx[g] + 0 > 0) ctx[g]--
    prevk = keep
    if (!keep && wt != "" && !seenw && t ~ wt) { keep = 1; seenw = 1 }
    if (!keep && rd != "" && !seenr && t ~ rd) { keep = 1; seenr = 1 }
    if (keep) { if (nb < B) { emit(p, n, t); nb++ } else { dropped++; keep = 0 } }
    j = nr % TN; rp[j] = p; rn[j] = n; rt[j] = t; rk[j] = keep; nr++
  }
  # A journal/docker stream starts with its last HN lines (-n/--tail): lines the snapshot already
  # read, then any written since. They are held until HN arrived (or one quiet nap), and the longest
  # prefix that is a suffix of the snapshot's last lines (FW_SNAPTAIL) is dropped: nothing written
  # between the snapshot and the follow's start is lost, nothing is read twice.
  function release(   o, k, best) {
    hold = 0; best = 0
    for (o = (nh < nt) ? nh : nt; o > 0; o--) {
      for (k = 1; k <= o && H[k] == T[nt - o + k]; k++) ;
      if (k > o) { best = o; break }
    }
    for (k = best + 1; k <= nh; k++) line(H[k])
    split("", H); nh = 0
  }
  function control(c,   a) {
    split(c, a, " ")
    if (hold && (a[1] == "s" || a[1] == "h")) { if (nh > 0 && !got) release(); got = 0 }
    if (a[1] == "s") { batch_end(1); return }
    if (a[1] == "h") { show_partial(); batch_end(0); printf "H\t%s\t%s\t%s\t%s\t%s\t%.0f\n", a[2], a[3], a[4], a[5], a[6], pos; fflush(); return }
    if (a[1] == "a") { pos = a[2] + 0; ln = (a[3] == "-") ? -1 : a[3] + 0; pend = ""; printf "A\t%s\t%s\n", a[2], a[3]; fflush(); return }
    if (a[1] == "r") { show_partial(); batch_end(0); pend = ""; split("", ctx); prevk = 0; pos = 0; ln = 0
      printf "R\t%s\t%s\t%s\n", a[2], a[3], substr(c, length(a[1] a[2] a[3]) + 4); fflush(); return }
    if (a[1] == "k") { batch_end(0); pend = ""; pos = a[2] + 0; ln = -1
      printf "X\tfollow: the log grew by more than %s bytes at once: skipped to byte %.0f\n", SK, pos; fflush(); return }
    if (a[1] == "n") { batch_end(0); printf "X\t%s\n", substr(c, 3); fflush(); return }
    if (a[1] == "g") { batch_end(0); printf "G\t%s\n", a[2]; fflush(); return }
  }
  BEGIN { MK = ENVIRON["FW_MARK"] " "; kw = ENVIRON["FD_KW"]; rs = ENVIRON["FD_RS"]; tg = ENVIRON["FD_TAGS"]
    wt = ENVIRON["FW_WAIT"]; rd = ENVIRON["FW_READY"]; ML = ENVIRON["FD_MAXLINE"] + 0; C = ENVIRON["FW_CTX"] + 0
    B = ENVIRON["FW_BATCH"] + 0; TN = ENVIRON["FW_TAILN"] + 0; SK = ENVIRON["FW_SKIP"]; pos = 0; ln = -1; pend = ""; buf = ""
    HN = ENVIRON["FW_HOLD"] + 0; nt = (HN > 0) ? split(ENVIRON["FW_SNAPTAIL"], T, "\n") : 0; hold = (nt > 0); nh = 0 }
  {
    i = index($0, MK)
    if (i > 0) { pend = pend substr($0, 1, i - 1); control(substr($0, i + length(MK))); next }
    t = pend $0; pend = ""
    if (hold) { H[++nh] = t; got = 1; if (nh >= HN) release(); next }
    line(t)
  }
