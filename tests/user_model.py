"""A user's own model builder, loaded as model.name=tests.user_model:tiny."""


def tiny(input_shape, num_classes, units=8):
    import tf_keras as keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(num_classes)])
