//! A checkpoint of the MNIST loop served over HTTP by nimbus Serve, as the
//! `serve_mnist` example does: the replicas' answers are the checkpoint's
//! own predictions here, batched or not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_serve::{Application, Autoscaling, HttpOptions, Serve, ServeStatus};
use nimbus_train::ScalingConfig;

use crate::serve_mnist::{test_digits, MnistCnn, Prediction};
use crate::tests::{fit, ok, run_config, small};

/// One HTTP answer: status and body.
fn post(url: &str, body: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut answer = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.body_mut().read_to_string().unwrap())
}

pub async fn a_trained_checkpoint_is_served_over_http_in_batches(_: &mut nimbus::Driver) {
    let (result, _) = fit(small(20), ScalingConfig::workers(2), run_config("served")).await;
    ok(&result);
    let checkpoint = result.checkpoint.expect("a checkpoint").path;
    let local = MnistCnn::load(&checkpoint).unwrap();
    let serve = Serve::start(HttpOptions::default().port(0)).await.unwrap();
    let app = Application::new::<MnistCnn>(checkpoint.clone())
        .unwrap()
        .route_prefix("/mnist")
        .num_replicas(2)
        .num_cpus(0.5)
        .max_ongoing_requests(8)
        .batching(8, Duration::from_millis(20));
    serve.run(app).await.unwrap();
    let url = format!("http://{}/mnist", serve.addresses()[0]);

    // 48 digits from 8 clients at once: batches form on busy replicas.
    let (images, _) = test_digits(48, 5);
    let expected = local.predict(&images);
    let (client_url, client_images) = (url.clone(), images.clone());
    let served: Vec<(u16, String)> = tokio::task::spawn_blocking(move || {
        std::thread::scope(|scope| {
            let clients: Vec<_> = client_images
                .chunks(6)
                .map(|chunk| {
                    let url = &client_url;
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|image| post(url, &serde_json::to_string(image).unwrap()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            clients
                .into_iter()
                .flat_map(|client| client.join().unwrap())
                .collect()
        })
    })
    .await
    .unwrap();
    for (i, ((status, body), here)) in served.iter().zip(&expected).enumerate() {
        assert_eq!(*status, 200, "image {i}: {body}");
        let answer: Prediction = serde_json::from_str(body).unwrap();
        assert_eq!(
            answer.digit, here.digit,
            "image {i}: served {answer:?}, here {here:?}"
        );
        assert!(
            (answer.probability - here.probability).abs() < 1e-4,
            "image {i}: served {answer:?}, here {here:?}"
        );
    }

    // A wrong shape and a body that is not JSON: 400, saying what is wrong.
    let (url_a, url_b) = (url.clone(), url.clone());
    let (status, body) = tokio::task::spawn_blocking(move || post(&url_a, "[0.5, 0.5]"))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("784 pixel intensities") && body.contains("got 2"),
        "{body}"
    );
    let (status, body) = tokio::task::spawn_blocking(move || post(&url_b, "[0.5,"))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");

    // A checkpoint that is not there fails the deploy, naming it.
    let missing = checkpoint.with_file_name("checkpoint_999999999");
    let app = Application::new::<MnistCnn>(missing.clone())
        .unwrap()
        .name("missing")
        .route_prefix("/missing")
        .num_cpus(0.5);
    let error = serve
        .run(app)
        .await
        .expect_err("no checkpoint there")
        .to_string();
    assert!(
        error.contains("cannot load the MNIST CNN") && error.contains("checkpoint_999999999"),
        "{error}"
    );
    serve.shutdown().await.unwrap();
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Waits until `serve` has `replicas` replicas of its one application.
async fn wait_replicas(serve: &Serve, replicas: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: ServeStatus = serve.status().await.unwrap();
        if status.applications[0].replicas.len() == replicas {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not {replicas} replicas within 30 s: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One cluster for serving and training: an autoscaled deployment under
/// load holds 1.5 of each node's 2 CPUs (3 replicas, the maximum); a
/// 2-worker training run cannot be placed until serving gives replicas
/// back, which it does, one a round, while the run waits. The run is
/// placed within 10 s and trains; no request fails; once the run is over,
/// the load brings serving back to 3 replicas.
pub async fn serving_gives_replicas_back_to_a_training_run(_: &mut nimbus::Driver) {
    let (trained, _) = fit(small(10), ScalingConfig::workers(2), run_config("to-serve")).await;
    ok(&trained);
    let checkpoint = trained.checkpoint.expect("a checkpoint").path;
    let serve = Serve::start(HttpOptions::default().port(0)).await.unwrap();
    let app = Application::new::<MnistCnn>(checkpoint)
        .unwrap()
        .route_prefix("/mnist")
        .num_cpus(1.5)
        .max_ongoing_requests(2)
        .autoscaling(
            Autoscaling::new(1, 3)
                .target_ongoing_requests(0.2)
                .upscale_delay(Duration::from_secs(1))
                .downscale_delay(Duration::from_secs(600)),
        );
    serve.run(app).await.unwrap();
    let url = format!("http://{}/mnist", serve.addresses()[0]);
    let stop = Arc::new(AtomicBool::new(false));
    // The clients stop however this test ends.
    let _stop = StopOnDrop(stop.clone());
    let (image, _) = test_digits(1, 1);
    let body = serde_json::to_string(&image[0]).unwrap();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (url, body, stop) = (url.clone(), body.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(post(&url, &body));
                }
                answers
            })
        })
        .collect();
    wait_replicas(&serve, 3, "serving grows under load").await;

    // The run needs 1 CPU per worker; each node has 0.5 left.
    let run = run_config("beside-serving").placement_timeout(Duration::from_secs(10));
    let (result, _) = fit(small(10), ScalingConfig::workers(2), run).await;
    ok(&result);
    wait_replicas(&serve, 3, "serving grows back after the run").await;
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<(u16, String)> = tokio::task::spawn_blocking(move || {
        clients
            .into_iter()
            .flat_map(|client| client.join().unwrap())
            .collect()
    })
    .await
    .unwrap();
    assert!(!answers.is_empty());
    if let Some(failed) = answers.iter().find(|(status, _)| *status != 200) {
        panic!("{} requests, one failed: {failed:?}", answers.len());
    }
    serve.shutdown().await.unwrap();
}
