/*
 * bundlerun's QEMU TCG plugin: counts the guest instructions executed by the whole
 * emulated session (boot, bundle load, every execution, exit) and prints one line
 * at exit through QEMU's plugin log (`-d plugin -D FILE` sends it to FILE):
 *
 *   bundlerun-insn-count: insns=N
 *
 * Counting is inline, per translated block (the block's instruction count is added
 * each time the block runs): exact for straight-line blocks, and off only by the
 * rest of a block an exception leaves early, like QEMU's own contrib/plugins/insn.c
 * in its default (inline) mode. The count of a deterministic bare-metal program
 * is the same run after run, which is what makes it gateable.
 *
 * Built by build_qemu_plugin.sh against the qemu-plugin.h of the installed QEMU's
 * Debian source (plugin API version 1, QEMU 7.2).
 */
#include <inttypes.h>
#include <stdio.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static uint64_t insns;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns,
                                             qemu_plugin_tb_n_insns(tb));
}

static void at_exit(qemu_plugin_id_t id, void *data)
{
    char line[64];
    (void)id;
    (void)data;
    snprintf(line, sizeof line, "bundlerun-insn-count: insns=%" PRIu64 "\n", insns);
    qemu_plugin_outs(line);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    (void)info;
    (void)argv;
    if (argc != 0) {
        fprintf(stderr, "bundlerun insn_count plugin takes no arguments\n");
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
