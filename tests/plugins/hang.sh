#!/bin/sh
# A plugin that never answers, with a child in its process group (no job control in a
# non-interactive sh, so the background sleep stays in the group). Writes its PID, which
# is its process group ID, to $HANG_PIDFILE first.
echo $$ > "$HANG_PIDFILE"
sleep 300 &
sleep 300
