# Shared by the one-call device plans (scripts/h200_*.sh): `source scripts/device_call.sh "$OUT"`.
# Sets `out`, `deadline` (now + BUDGET_S, default 570 s, inside the device tool's 600 s a call)
# and `log`; installs the carried ncu_report wheel (.whl/, see README, Capturing); records the
# GPU; and defines `step` and `archive`, so a plan is a list of time-boxed steps whose outputs
# come back even when the call is cut off.
set -uo pipefail
out=$(realpath -m "${1:?usage: bash SCRIPT OUT_DIR}")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit  # the repository root, whatever the caller's
mkdir -p "$out"
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site \
    .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log="$out/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$log"

step() {  # step NAME NEEDED_S COMMAND...: run if NEEDED_S are left, limited to what is left
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need || left <= 15 )); then
    echo "== skip $name: ${left} s left" | tee -a "$log"
    return
  fi
  echo "== $name (${left} s left)" | tee -a "$log"
  # SIGTERM at the limit (the workbench stops ncu's process group on it), SIGKILL 5 s later
  timeout -k 5 $(( left - 10 )) "$@" 2>&1 | grep -v "it/s\]$" | tee -a "$log" | tail -60
  echo "== $name: exit status ${PIPESTATUS[0]}" | tee -a "$log"
}

archive() {  # archive FOLDER...: each as FOLDER.tar.gz beside it, then removed (16 MB a file)
  local d
  for d in "$@"; do
    [ -d "$d" ] && tar czf "${d%/}.tar.gz" -C "$(dirname "$d")" "$(basename "$d")" && rm -rf "$d"
  done
  return 0
}
