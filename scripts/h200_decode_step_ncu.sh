#!/usr/bin/env bash
# One device call for issue 5's last report: every kernel of one decode step of the model
# (stock MoE, Triton attention, one layer), collected several ways to learn which a committed
# report can afford. ncu's sets and sections are logged first; each report is archived on its
# own, with the share of its bytes that are embedded cubins (ELF images) logged.
# First call (log raw/h200-decode-step-ncu-log.txt): without PM sampling 28.7 MB gzipped,
# --set detailed 23.5 MB (171 MB unpacked), for 133 kernels. Second call (STAGE=2): the
# sections the analysis reads, with and without SourceCounters.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_decode_step_ncu.sh "$OUT"
source "$(dirname "$0")/device_call.sh" "$@"
export PATH=/usr/local/cuda/bin:$PATH
{ ncu --version; ncu --list-sets; ncu --list-sections; } 2>&1 | tee -a "$log" | tail -5
decode=(model-decode-step stock --tokens 1 --param layers=1 --param attention=triton)
capture() {  # capture NAME NEEDED_S ARGS...: one `workbench ncu` decode-step run, archived
  local name=$1 need=$2; shift 2
  step "$name" "$need" python3 -m workbench.cli ncu "${decode[@]}" "$@" --out "$out/$name" \
    --name "model-decode-step-stock-T1-$name"
  du -sh "$out/$name"/* 2>/dev/null | tee -a "$log"
  python3 - "$out/$name"/*.ncu-rep <<'PY' 2>&1 | tee -a "$log"
import re, struct, sys
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    elf = 0
    for m in re.finditer(rb"\x7fELF\x02", data):  # ELF64: section headers end the image
        shoff, = struct.unpack_from("<Q", data, m.start() + 0x28)
        size, count = struct.unpack_from("<HH", data, m.start() + 0x3A)
        elf += shoff + size * count
    print(f"{path}: {len(data)} bytes, of them {elf} in embedded ELF images")
    images = [data[m.start():m.start() + 64] for m in re.finditer(rb"\x7fELF\x02", data)]
    print(f"{len(images)} ELF images, {len(set(images))} distinct headers")
PY
  [ -n "${keep:-}" ] || archive "$out/$name"
}
analysed=(SpeedOfLight LaunchStats Occupancy WarpStateStats ComputeWorkloadAnalysis
          MemoryWorkloadAnalysis SchedulerStats InstructionStats)
if [ "${STAGE:-1}" = 1 ]; then
  capture nopm 120 --section 'regex:^(?!PmSampling)'
  capture detailed 100 --set detailed
  capture full 120 --set full
elif [ "$STAGE" = 2 ]; then
  capture nosource 100 $(printf -- '--section %s ' "${analysed[@]}")
  capture analysed 150 $(printf -- '--section %s ' "${analysed[@]}" SourceCounters)
else  # the cubins repeat across kernels: does a long-window compressor fold them together?
  keep=1 capture analysed 150 $(printf -- '--section %s ' "${analysed[@]}" SourceCounters)
  rep=$(ls "$out"/analysed/*.ncu-rep)
  step xz 200 xz -9 -k -T1 -v "$rep"
  if command -v zstd >/dev/null; then step zstd 60 zstd -19 --long=27 -T0 -k "$rep"; fi
  ls -la "$out"/analysed | tee -a "$log"
  rm -f "$rep"
fi
ls -la "$out" | tee -a "$log"
