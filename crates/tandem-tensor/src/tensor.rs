use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

/// A dense `f32` tensor: a shape and its elements in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
        }
    }

    /// Wraps `data`; `None` when its length is not the product of `shape`.
    pub fn from_vec(shape: &[usize], data: Vec<f32>) -> Option<Self> {
        (data.len() == shape.iter().product::<usize>()).then(|| Self {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Samples from a normal distribution of mean 0 and standard deviation `stddev`, redrawing
    /// every value further than two standard deviations from the mean (TensorFlow's
    /// `truncated_normal_initializer`).
    pub fn truncated_normal(shape: &[usize], stddev: f32, rng: &mut impl Rng) -> Self {
        let len = shape.iter().product();
        let data = (0..len)
            .map(|_| loop {
                let z: f32 = StandardNormal.sample(rng);
                if z.abs() <= 2.0 {
                    break z * stddev;
                }
            })
            .collect();
        Self {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The shape, outermost dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements in row-major order.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements in row-major order, mutably.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Gives up the storage.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn truncated_normal_stays_within_two_stddev_with_the_right_spread() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let t = Tensor::truncated_normal(&[200, 100], 0.1, &mut rng);
        assert_eq!(t.shape(), &[200, 100]);
        assert!(t.data().iter().all(|v| v.abs() <= 0.2));
        let n = t.len() as f64;
        let mean = t.data().iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = t
            .data()
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        // A normal truncated at +-2 sigma keeps 0.774 of its variance.
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!(
            (var.sqrt() - 0.1 * 0.774f64.sqrt()).abs() < 0.002,
            "std {}",
            var.sqrt()
        );
    }

    #[test]
    fn from_vec_checks_length() {
        assert!(Tensor::from_vec(&[2, 3], vec![0.0; 6]).is_some());
        assert!(Tensor::from_vec(&[2, 3], vec![0.0; 5]).is_none());
    }

    #[test]
    fn a_tensor_is_written_in_place_and_gives_its_storage_up() {
        let mut t = Tensor::zeros(&[2, 2]);
        assert!(!t.is_empty());
        t.data_mut()[3] = 5.0;
        assert_eq!(t.into_vec(), [0.0, 0.0, 0.0, 5.0]);
        assert!(Tensor::zeros(&[3, 0]).is_empty());
    }
}
