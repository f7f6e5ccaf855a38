"""A user's own model builder, loaded as model.name=tests.user_model:tiny."""


def tiny(input_shape, num_classes, units=8):
    import tf_keras as keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(num_classes)])


def frozen_first_layer(input_shape, num_classes, unfreeze_at_epoch=1, units=8):
    """A builder that asks the engine for freeze-then-unfreeze (`models.fine_tuning`): its
    first Dense layer is built frozen and trains from epoch `unfreeze_at_epoch` on, at half
    the rate."""
    import tf_keras as keras

    from tftrain.models import fine_tuning

    first = keras.layers.Dense(units, activation="relu", trainable=False, name="first")
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), first,
                              keras.layers.Dense(num_classes)])
    fine_tuning.schedule(model, fine_tuning.UnfreezeSchedule((first,), unfreeze_at_epoch, 0.5))
    return model
