# shellcheck shell=sh
# The preflight checks before the GPU snippet: see fleetdiag/preflight.py.

LC_ALL=C; export LC_ALL
echo "$FD_MARK begin 1"
if [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then printf 'F\tlogin_cvd\t%s\n' "$CUDA_VISIBLE_DEVICES"; fi
if [ -n "$FD_MODEL" ]; then
  if [ -e "$FD_MODEL" ]; then printf 'F\tmodel\tpresent\n'; else printf 'F\tmodel\tabsent\n'; fi
elif [ -n "$FD_MODEL_HOME" ]; then
  if [ -e "$HOME/$FD_MODEL_HOME" ]; then printf 'F\tmodel\tpresent\n'; else printf 'F\tmodel\tabsent\n'; fi
fi
if [ -n "$FD_HF_REPO" ]; then
  hc=$FD_HF_CACHE
  if [ -z "$hc" ]; then
    if [ -n "$HF_HUB_CACHE" ]; then hc=$HF_HUB_CACHE
    elif [ -n "$HF_HOME" ]; then hc=$HF_HOME/hub
    else hc=${XDG_CACHE_HOME:-$HOME/.cache}/huggingface/hub; fi
  fi
  if [ -d "$hc/$FD_HF_REPO/snapshots" ]; then printf 'F\thf_cache\tpresent\t%s\n' "$hc"; else printf 'F\thf_cache\tabsent\t%s\n' "$hc"; fi
fi
