"""scripts/dense_wgmma_sass.py compiles the Gluon W8A8 and W8A16 kernels for sm_90 on the CPU
(Triton's bundled ptxas and nvdisasm) and reads what their design rests on off the SASS.
Gluon has no interpreter, so this is the CPU's check of the kernels;
tests/test_dense_kernels.py runs them on a GPU. Its own process: the tests import the kernels
under the interpreter."""

import pytest
from helpers import run_compile_script


def run(*args: str, interpret: bool = False):
    return run_compile_script("dense_wgmma_sass.py", *args, interpret=interpret)


def facts_of(done) -> dict[str, str]:
    """The script's "name: value" lines (after its heading) of a finished run."""
    return dict(line.split(": ", 1) for line in done.stdout.splitlines()[1:])


def with_and_without(args: list[str], flag: str) -> tuple[dict[str, str], dict[str, str]]:
    """The facts of the kernel compiled with `flag` and without it, both compiled."""
    given, plain = run(*args, flag), run(*args)
    assert given.returncode == 0 and plain.returncode == 0, given.stderr + plain.stderr
    return facts_of(given), facts_of(plain)


@pytest.mark.parametrize(("block_m", "block_n", "stages"), [(128, 128, 4), (128, 64, 6),
                                                              (256, 128, 4)])  # fmt: skip
def test_each_warpgroup_waits_once_a_wave_and_nothing_is_serialised(block_m, block_n, stages):
    done = run("--block-m", str(block_m), "--block-n", str(block_n), "--stages", str(stages))
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["spilled bytes"] == "0"
    assert facts["ptxas notes"] == "none"  # no C7514 / C7512: ptxas kept the wgmmas async
    # two warpgroups, each a K step's four m64nNk32 FP8 wgmmas a wave as one group with one
    # wait (a 256-row tile's second wave among them: its rescale of the first did not sink
    # below the second's wgmmas, which would read registers in flight)
    waves = block_m // 128
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"]) == (str(8 * waves), str(2 * waves))
    # the rescale: one FFMA an accumulator element (64 x block_n a warpgroup's wave over its
    # 128 threads), the product of row and weight scale computed once a row
    assert facts["FFMA"] == str(2 * waves * 64 * block_n // 128)
    assert facts["FFMA between a wgmma and its wait"] == "0"
    # only the load warp copies: its one activation box and one weight box a step (with the
    # warpgroups refilling, a prologue of STAGES steps and warpgroup 0's refill made
    # 2 + 2 x STAGES), and setmaxnreg takes the consumers from the launch's 168 registers a
    # thread to 232 and the load warp's warpgroup to 40
    assert facts["TMA loads"] == "2" and facts["registers"] == "168"
    assert {"40", "232"} <= set(facts["setmaxnreg"].split())


@pytest.mark.parametrize(("block_m", "stages"), [(128, 5), (256, 3)])
def test_ring_scales_come_by_tma_and_are_read_from_shared_memory(block_m, stages):
    """`ring_scales`: the load warp copies a third box a step, the row scales, and each
    warpgroup reads a wave's two rows a thread (r and r + 8 of its m64 tile) from shared
    memory between the slot's wait and its release; the only global loads left are the weight
    scale's (a tile's first step and each next one, in each warpgroup), where without the
    ring the row scales are loaded too. The wgmmas are grouped and waited for as without."""
    args = ["--block-m", str(block_m), "--stages", str(stages)]
    facts, without = with_and_without(args, "--ring-scales")
    waves = block_m // 128
    assert (facts["spilled bytes"], facts["ptxas notes"]) == ("0", "none")
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"]) == (str(8 * waves), str(2 * waves))
    assert facts["TMA loads"] == "3" and without["TMA loads"] == "2"
    # every one read after a wait for a slot's copy and before a slot's release, so after the
    # scales landed and before the load warp may copy the next ones over them (Triton 3.7 adds
    # shared loads of its own, outside, to either kernel)
    inside = "LDS (32-bit) between a slot's wait and a release"
    assert (facts[inside], without[inside]) == (str(2 * 2 * waves), "0")
    assert int(facts["LDS (32-bit)"]) - int(without["LDS (32-bit)"]) == 2 * 2 * waves
    assert facts["LDG (32-bit)"] == "4" and int(without["LDG (32-bit)"]) > 4


@pytest.mark.parametrize(("block_m", "stages", "ring"), [(128, 5, False), (256, 3, True)])
def test_staged_weight_scales_leave_no_global_load_in_the_k_loop(block_m, stages, ring):
    """`staged_weight_scales`: each warpgroup's K step reads its weight scale from the tile's
    staged buffer (one 32-bit shared load a step, between the slot's wait and its release, as
    the ring's row scales are), not the next step's from global memory, so with the row scales
    in the ring no global load is left in either warpgroup's K loop; the wgmmas are grouped
    and waited for as without, nothing spills, and the step is shorter."""
    args = ["--block-m", str(block_m), "--stages", str(stages), *(["--ring-scales"] * ring)]
    facts, without = with_and_without(args, "--staged-weight-scales")
    waves = block_m // 128
    assert (facts["spilled bytes"], facts["ptxas notes"]) == ("0", "none")
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"]) == (str(8 * waves), str(2 * waves))
    # the weight scale's load gone from each warpgroup's loop; without the ring, the next
    # step's row scales are still loaded there
    loads = [int(n) for n in facts["LDG in each innermost MMA loop"].split()]
    loads_without = [int(n) for n in without["LDG in each innermost MMA loop"].split()]
    assert [n + 1 for n in loads] == loads_without
    assert not ring or loads == [0, 0]
    inside = "LDS (32-bit) between a slot's wait and a release"
    assert int(facts[inside]) - int(without[inside]) == 2  # one a warpgroup's step
    loops = [int(size) for size in facts["instructions in each innermost MMA loop"].split()]
    loops_without = without["instructions in each innermost MMA loop"].split()
    assert len(loops) == 2 and all(a < int(b) for a, b in zip(loops, loops_without, strict=True))
    # the block barriers Gluon puts before a step's slot wait and its one-thread release, with
    # or without the staging (docs/design.md: what DeepGEMM's K loop does not have)
    assert facts["BAR.SYNC in each innermost MMA loop"] == "2 2"
    assert without["BAR.SYNC in each innermost MMA loop"] == "2 2"


@pytest.mark.parametrize("stages", [4, 3])
def test_the_wide_tiles_rescale_each_block_once_and_serialise_nothing(stages):
    """128 x 192 tiles (kernels/dense/w8a8_wide.py): each warpgroup's K step is a 128-wide
    and a 64-wide wgmma (4 m64nNk32 each) in one group with one wait, each product folded in
    with its own weight scale, one FFMA an accumulator element (96 a thread, two warpgroups),
    and the load warp copies three boxes a step (activations, the whole weight block, the half
    one); 168 registers a thread, no spills, nothing serialised."""
    done = run("--kernel", "w8a8-wide", "--stages", str(stages))
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert (facts["spilled bytes"], facts["ptxas notes"]) == ("0", "none")
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"]) == ("16", "2")
    assert facts["QGMMA shapes"] == "64x128x32 x8, 64x64x32 x8"
    # every rescale after its wgmmas' wait: none reads an accumulator in flight
    assert facts["FFMA"] == str(2 * (64 + 32))
    assert facts["FFMA between a wgmma and its wait"] == "0"
    # each warpgroup's K step one loop with nothing looping inside it (about 195 instructions
    # under Triton 3.6 and 3.7)
    loops = facts["instructions in each innermost MMA loop"].split()
    assert len(loops) == 2 and all(150 < int(size) < 250 for size in loops)
    assert facts["TMA loads"] == "3" and facts["registers"] == "168"
    assert {"40", "232"} <= set(facts["setmaxnreg"].split())


@pytest.mark.parametrize(("block_t", "stages", "split"), [(64, 6, False), (128, 4, True),
                                                         (128, 4, False)])  # fmt: skip
def test_the_w8a16_kernels_wgmmas_stay_in_flight_and_nothing_is_serialised(block_t, stages,
                                                                           split):  # fmt: skip
    """W8A16: each warpgroup peels the first K step, runs two a loop iteration and one in the
    tail (8 m64nTk16 bf16 wgmmas a 128-deep step, one group each), and ptxas serialises none:
    the first step starts the accumulator (use_acc=False), so nothing else writes it in flight
    (C7515). A thread loads a step's 64 weight bytes as four 16-byte shared loads (the K order
    of kernels/dense/k_order.py), not 32 two-byte ones."""
    args = ["--kernel", "w8a16", "--block-t", str(block_t), "--stages", str(stages)]
    done = run(*args, *(["--split"] if split else []))
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["spilled bytes"] == "0"
    assert facts["ptxas notes"] == "none"
    assert facts["HGMMA"] == str(2 * 8 * (1 + 2 + 1))  # two warpgroups; peeled, loop, tail
    assert (facts["LDS.128"], facts["LDS.U16"]) == (str(2 * 4 * (1 + 2 + 1)), "0")


@pytest.mark.parametrize("pdl", [False, True])
def test_the_w8a16_kernel_with_pdl_waits_after_its_first_weight_copy(pdl):
    """With PDL (kernels/pdl.py) the W8A16 kernel starts one TMA copy, the first ring slot's
    weights (EARLY_SLOTS), before it waits for the grid before, and lets the next grid
    launch once; its K loop is the same (the same wgmmas and shared loads). Without PDL it
    neither waits nor lets the next grid launch early."""
    done = run("--kernel", "w8a16", "--split", "--stages", "6", *(["--pdl"] if pdl else []))
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert (facts["spilled bytes"], facts["ptxas notes"]) == ("0", "none")
    assert facts["HGMMA"] == str(2 * 8 * (1 + 2 + 1)) and facts["LDS.128"] == str(2 * 4 * 4)
    waits = ("1", "1", "1") if pdl else ("0", "0", "0")
    assert (facts["grid waits (ACQBULK)"], facts["TMA loads before the wait"],
            facts["next-grid launches (PREEXIT)"]) == waits  # fmt: skip
    # with PDL or without, the scales are asked for first (the kernel's prologue): their one
    # 4-byte global load is found, and no TMA copy precedes it
    assert facts["TMA loads before the scales' load"] == "0"


def test_the_w8a16_kernel_capped_for_two_blocks_an_sm_serialises_its_wgmmas():
    """Why the W8A16 kernel runs one block an SM (docs/design.md, the 64-row captures): at 128
    registers a thread ptxas fits it without spills but serialises its wgmmas (C7511), so two
    blocks an SM need a kernel built for fewer registers, not a launch option."""
    done = run("--kernel", "w8a16", "--split", "--stages", "3", "--consumer-regs", "128",
               "--max-registers", "128")  # fmt: skip
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert (facts["registers"], facts["spilled bytes"]) == ("128", "0")
    assert "C7511" in facts["ptxas notes"].split()


def test_bad_settings_and_the_interpreter_are_refused():
    assert run("--block-n", "256").returncode == 2
    assert run("--block-m", "64").returncode == 2
    done = run(interpret=True)
    assert done.returncode == 2 and "unset it" in done.stderr


def test_the_moe_down_kernels_wgmmas_are_one_group_a_step_and_nothing_is_serialised():
    """The MoE W8A8 down kernel: each warpgroup's K step is two groups (an item's two column
    tiles) of four m64n128k32 FP8 wgmmas with one wait each, the second group's issued after
    the first's rescale, and ptxas serialises none of them. Its load warp alone copies: one
    box of h and one of the weights a step."""
    done = run("--kernel", "moe-down", "--stages", "4")
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["spilled bytes"] == "0"
    assert facts["ptxas notes"] == "none"
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"]) == ("16", "4")
    assert facts["TMA loads"] == "2" and {"40", "232"} <= set(facts["setmaxnreg"].split())


@pytest.mark.parametrize(("kernel", "copies"), [("moe-bf16-gate-up", "8"), ("moe-bf16-down", "0")])
def test_the_moe_bf16_kernels_keep_a_step_of_wgmmas_in_flight(kernel, copies):
    """The MoE bf16 kernels (kernels/moe/bf16_wgmma.py): a warpgroup's K step is two boxes of
    four m64n128k16 bf16 wgmmas, issued at two places (an item's first step, the loop), and
    three waits (the first step's, which waits for nothing, the loop's for the step before,
    the item's last); gate/up's load warps copy a step's 128 x 64 rows as 8 16-byte cp.async
    a thread; no spills and nothing serialised."""
    done = run("--kernel", kernel, "--stages", "4")
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["spilled bytes"] == "0"
    assert facts["ptxas notes"] == "none"
    assert (facts["HGMMA"], facts["WARPGROUP.DEPBAR"]) == ("32", "6")
    assert facts["LDGSTS.128"] == copies


def test_the_moe_w8a8_gate_up_kernel_rescales_each_box_and_gathers_its_rows():
    """The MoE W8A8 gate/up kernel (kernels/moe/w8a8_gate_up_wgmma.py): per warpgroup and K
    step, the gate box's and the up box's four m64n128k32 FP8 wgmmas, one wait each (the
    product is rescaled between them), and the load warps' 8 16-byte cp.async a thread; no
    spills and nothing serialised."""
    done = run("--kernel", "moe-w8a8-gate-up", "--stages", "4")
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["spilled bytes"] == "0"
    assert facts["ptxas notes"] == "none"
    assert (facts["QGMMA"], facts["WARPGROUP.DEPBAR"], facts["LDGSTS.128"]) == ("16", "4", "8")


@pytest.mark.parametrize(("kernel", "mmas"), [("moe-int4-gate-up", "24"), ("moe-int4-down", "16")])
def test_the_moe_int4_decode_kernels_convert_each_word_as_loaded(kernel, mmas):
    # a K step is one 16-row MMA tile a warp, its low and high nibbles four k16 MMAs each, for
    # gate's and up's boxes (gate/up) or one box (down), and eight more for the -136 times
    # the activations' sum that both boxes start from; no byte is taken out of a loaded word
    # or put into one (bytes loaded one by one cost 260 instructions a step); no bf16 FMA
    # (the weights convert to 128 + q); one TMA copy a step, gate/up's two boxes one 3-D box
    # (the ring's STAGES first fills, then the refill in the loop); and registers few enough
    # for the four programs an SM the host launches (4 x 128 threads x 128)
    done = run("--kernel", kernel, "--stages", "4")
    assert done.returncode == 0, done.stderr
    facts = facts_of(done)
    assert facts["HMMA"] == mmas
    assert facts["byte PRMT"] == "0"
    assert facts["bf16 FMA"] == "0"
    assert facts["TMA loads"] == "5"
    assert int(facts["registers"]) <= 128 and facts["spilled bytes"] == "0"


@pytest.mark.parametrize(("kernel", "mmas", "stages"), [("moe-int4-gate-up", 48, "3"),
                                                        ("moe-int4-down", 32, "4")])  # fmt: skip
def test_a_two_group_ring_slot_spends_its_fixed_work_on_two_k_steps(kernel, mmas, stages):
    # Two K steps a slot (int4_mma.Ring(groups=2)): twice a step's MMAs in the loop, a slot's
    # wait, CTA barriers and refill once for both, so fewer instructions a step than the
    # one-step ring's, still without spills in the registers four programs an SM leave; the
    # deepest ring four programs of gate/up fit in shared memory (Ring.check), one TMA copy a
    # slot (the first fills, then the refill in the loop).
    two = run("--kernel", kernel, "--stages", stages, "--groups", "2")
    one = run("--kernel", kernel, "--stages", "4")
    assert two.returncode == 0 and one.returncode == 0, two.stderr + one.stderr
    two, one = facts_of(two), facts_of(one)
    assert int(two["HMMA"]) == mmas == 2 * int(one["HMMA"])
    assert int(two["registers"]) <= 128 and two["spilled bytes"] == "0"
    assert two["TMA loads"] == str(int(stages) + 1)
    assert two["BAR.SYNC in each innermost MMA loop"] == one["BAR.SYNC in each innermost MMA loop"]
    per_step = int(two["instructions in each innermost MMA loop"]) / 2
    assert per_step < 0.9 * int(one["instructions in each innermost MMA loop"])


@pytest.mark.parametrize("groups", ["1", "2"])
def test_down_fits_five_programs_an_sm_without_spills(groups):
    # Five programs an SM (int4_mma.Ring(programs_per_sm=5)) leave a thread 96 registers: down
    # compiles in them without spilling, one- and two-step slots (gate/up spills 40 bytes).
    result = run("--kernel", "moe-int4-down", "--stages", "2", "--groups", groups,
                 "--programs-per-sm", "5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    facts = facts_of(result)
    assert int(facts["registers"]) <= 96 and facts["spilled bytes"] == "0"


def test_down_with_pdl_fills_its_ring_before_it_waits_for_the_grid_before():
    # int4_mma.DOWN_PDL: the ring's four slots of weights are asked for, then one wait for the
    # grid before (griddepcontrol.wait: ACQBULK), and the K loop is the kernel's without PDL.
    pdl = run("--kernel", "moe-int4-down", "--stages", "4", "--pdl")
    plain = run("--kernel", "moe-int4-down", "--stages", "4")
    assert pdl.returncode == 0 and plain.returncode == 0, pdl.stderr + plain.stderr
    pdl, plain = facts_of(pdl), facts_of(plain)
    assert pdl["grid waits (ACQBULK)"] == "1" and plain["grid waits (ACQBULK)"] == "0"
    assert pdl["TMA loads before the wait"] == "4"
    loop = "instructions in each innermost MMA loop"
    assert pdl[loop] == plain[loop] and pdl["spilled bytes"] == "0"


def test_gate_up_with_pdl_is_refused():
    result = run("--kernel", "moe-int4-gate-up", "--pdl")
    assert result.returncode == 2 and "gate/up does not launch with PDL" in result.stderr


def test_gate_up_on_fp16_operands_converts_a_word_in_five_instructions():
    # int4_mma.GATE_UP_FP16: fp16's mantissa takes two nibbles a half, so a packed word turns
    # into fp16 operands in five integer instructions against bf16's eight: three fewer for
    # each of a thread's 16 words a step (gate's and up's 8 each), 96 in a two-step loop
    # (some of the saving may go to ptxas's scheduling); the same MMAs, no spills in the
    # registers four programs an SM leave.
    fp16, bf16 = with_and_without(
        ["--kernel", "moe-int4-gate-up", "--stages", "2", "--groups", "2"], "--fp16"
    )
    assert fp16["HMMA"] == bf16["HMMA"] == "48"
    assert int(fp16["registers"]) <= 128 and fp16["spilled bytes"] == "0"
    loop = "instructions in each innermost MMA loop"
    assert int(bf16[loop]) - int(fp16[loop]) >= 80


def test_down_on_fp16_operands_is_refused():
    result = run("--kernel", "moe-int4-down", "--fp16")
    assert result.returncode == 2 and "down's operands stay bf16" in result.stderr
