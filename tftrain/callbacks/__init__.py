"""Keras callbacks for the cross-cutting concerns of `tftrain train`, one per module.

backup        BackupAndRestore that resumes mid-epoch and says where it resumed
preemption    SIGTERM: back up at the next step and exit with PREEMPTED_EXIT_CODE
learning_rate the current learning rate in the logs (and so in TensorBoard)
step_timer    steady-state seconds per step and examples per second
stop_at_step  ends training after `train.steps` optimizer steps
divergence    train.on_nan: a NaN/Inf loss stops the run or rolls it back to the last backup
callback_state the callbacks' counters, saved in the backup (not a callback: a helper of backup)
"""
